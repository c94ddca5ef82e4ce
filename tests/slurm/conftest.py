"""The Slurm tests need a running Slurm (tools/slurm/start.sh; CI: .ci/setup/20-slurm.sh).

One Slurm session serves both files (slurm_session): the paper preset's run (test_slurm_paper.py) is submitted first
and runs on the test cluster while test_slurm_profile.py's smoke runs (local, faults, rerun, two nodes) go one after
another beside it. Most of each run's time is waiting for Slurm (queueing, the plugin's status checks), which the two
now share instead of holding both pytest-xdist workers; the files are one work unit (tests/conftest.py), so the other
worker runs the rest of the suite meanwhile. Each check still reads its own runs: the two workflow copies, configs and
Slurm jobs are separate, and a run that fails fails only the tests that read it.
"""

from __future__ import annotations

import time

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slurm: runs jobs through a real Slurm (sbatch); skipped, with the reason, when none is running",
    )


class SlurmSession:
    """What each part of the session gave: its result, or the exception (a failure, a skip) that ended it, which
    result() raises again for the tests of that part only."""

    def __init__(self):
        self.parts: dict[str, tuple[bool, object]] = {}

    def run(self, name: str, make, *args):
        started = time.monotonic()
        try:
            self.parts[name] = (True, make(*args))
        except BaseException as exc:  # pytest.fail / pytest.skip raise outcome exceptions (BaseException)
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.parts[name] = (False, exc)
        print(f"slurm session: {name} {time.monotonic() - started:.0f}s")
        return self.parts[name]

    def result(self, name: str):
        done, value = self.parts[name]
        if not done:
            raise value
        return value


@pytest.fixture(scope="session")
def slurm_session(tmp_path_factory) -> SlurmSession:
    from test_slurm_paper import finish_paper_run, start_paper_run
    from test_slurm_profile import profile_runs, two_node_run

    session = SlurmSession()
    paper_started, paper = session.run("paper start", start_paper_run, tmp_path_factory)
    try:
        profile_done, profile = session.run("profile", profile_runs, tmp_path_factory)
        if profile_done:
            session.run("two_nodes", two_node_run, profile)
        else:
            session.parts["two_nodes"] = (False, profile)
    finally:
        if paper_started:
            session.run("paper", finish_paper_run, paper)
        else:
            session.parts["paper"] = (False, paper)
    return session
