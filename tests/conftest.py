"""Fixtures shared by every test folder; the helpers themselves live in workflow_testing.py (importable by name).

Parallel runs (`make test`: pytest-xdist, `-n 2 --dist loadgroup --no-loadscope-reorder`): every test file is one
work unit, so a module's expensive fixture is built once, on one worker. Files that share a session-scoped fixture are
one unit together (SHARED_FIXTURES): the two Slurm files (one Slurm session), tests/conda (the conda stand-in and its
channel), the two apex build files (the one real compile of the fake apex) and the report files that read the
rendered fixture reports. The units are
handed out slowest first (SLOWEST_FIRST), so the Slurm unit (both Slurm files, their runs side by side on the test
cluster), the longest, starts at once on one worker and everything else fills in around it.

The grouping is done by the scheduler below (pytest_xdist_make_scheduler), not by `xdist_group` marks: pytest-xdist
3.8 applies those by rewriting `item._nodeid`, which pytest 9.2 no longer reads, so the marks group nothing.
"""

import signal
from pathlib import Path

import pytest

from workflow_testing import copy_workflow

# A suite started in the background by a non-interactive shell (`cmd &`) gets SIGINT ignored, and every process a test
# starts inherits that: the Ctrl-C tests (a `make run`, a venv install) would send a signal nothing can receive.
# Python's own handler instead, whose children start with the default, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SLURM_UNIT = "tests/slurm (slurm_session: the paper run beside the smoke runs)"
# Work units by how long they took on 2 cores, longest first; the others follow in collection order. The seconds:
# about what each took in a fresh-clone `.ci/run` of 2026-12-01 (2330 s in all), both Slurm runs side by side.
SLOWEST_FIRST = [
    # The two Slurm files: one unit, their runs side by side on the test cluster (tests/slurm/conftest.py). Alone on
    # 2 idle cores they took 259 s and 211 s (2026-12-01); in a fresh-clone run each held a worker for 730-1000 s.
    SLURM_UNIT,
    "tests/backbone/test_launch.py",  # 570
    "tests/conda/test_conda_offline.py",  # the tests/conda unit: 330
    "tests/backbone/test_cellserver.py",  # 200
    "tests/backbone/test_gpu_tools.py",  # 170
    "tests/backbone/test_module.py",  # 160
    # After those, on the worker the Slurm unit leaves free: the smoke run's own bound (300 s) is wall time, and beside
    # the Slurm jobs on 2 cores it took 652 s (2026-12-02, a machine under load)
    "the smoke preset run (smoke_preset_run)",  # test_pipeline 380 + test_pipeline_report 130, each with its own run
    "tests/apex/test_apex_build.py",  # the tests/apex unit of the one compile: 140
]
# Files that share a session-scoped fixture: one work unit, or each worker would build the fixture again.
SHARED_FIXTURES = {
    "tests/slurm/test_slurm_paper.py": SLURM_UNIT,
    "tests/slurm/test_slurm_profile.py": SLURM_UNIT,
    "tests/backbone/test_pipeline.py": "the smoke preset run (smoke_preset_run)",
    "tests/report/test_pipeline_report.py": "the smoke preset run (smoke_preset_run)",
    "tests/apex/test_apex_build.py": "tests/apex (built: the session's one compile of the fake apex)",
    "tests/apex/test_apex_cudakit.py": "tests/apex (built: the session's one compile of the fake apex)",
    "tests/conda/test_conda_failures.py": "tests/conda (standin, channel_standin)",
    "tests/conda/test_conda_offline.py": "tests/conda (standin, channel_standin)",
    "tests/report/test_breakdown.py": "tests/report (smoke_html, gpu_html, llm7b_html)",
    "tests/report/test_browser.py": "tests/report (smoke_html, gpu_html, llm7b_html)",
    "tests/report/test_render.py": "tests/report (smoke_html, gpu_html, llm7b_html)",
}


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or the group of files it shares a session fixture with."""
    path = nodeid.split("::", 1)[0]
    return SHARED_FIXTURES.get(path, path)


@pytest.hookimpl(optionalhook=True)  # a machine without pytest-xdist (a GPU box) runs the tests in one process
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


# CPU seconds per test phase: this process and every child it waited for (Snakemake and its jobs), and the forked
# runs of workflow_testing.snakemake(); not Slurm's jobs (slurmd's children). On 2 cores the suite is CPU-bound (the
# fresh-clone run of 99b1584 kept both cores 96 % busy for its 2419 s), so CPU, not wall time, says what a test costs.
# The costliest work units by CPU are printed at the end, beside pytest's --durations.
def _cpu_seconds() -> float:
    import resource

    import workflow_testing

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + workflow_testing.FORKED_CPU_SECONDS


def _timed(item, when):
    started = _cpu_seconds()
    try:
        return (yield)
    finally:  # before the phase's report is made, so the report carries it to xdist's controller
        item.user_properties.append(("cpu_seconds", when, round(_cpu_seconds() - started, 2)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _timed(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _timed(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    return (yield from _timed(item, "teardown"))


_CPU: dict[str, float] = {}


def pytest_runtest_logreport(report):
    for entry in report.user_properties:
        if len(entry) == 3 and entry[0] == "cpu_seconds" and entry[1] == report.when:
            _CPU[report.nodeid] = _CPU.get(report.nodeid, 0.0) + entry[2]


def pytest_terminal_summary(terminalreporter):
    if not _CPU:
        return
    units: dict[str, float] = {}
    for nodeid, seconds in _CPU.items():
        units[work_unit(nodeid)] = units.get(work_unit(nodeid), 0.0) + seconds
    write = terminalreporter.write_line
    terminalreporter.section(f"CPU seconds: {sum(_CPU.values()):.0f} in all; the 12 costliest work units")
    for unit, seconds in sorted(units.items(), key=lambda kv: -kv[1])[:12]:
        write(f"{seconds:8.1f}s  {unit}")


def pytest_collection_modifyitems(config, items):
    rank = {work_unit(name): index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable: collection order otherwise


@pytest.fixture(scope="session")
def smoke_preset_run(tmp_path_factory) -> tuple[Path, float, Path]:
    """The smoke preset end to end, once for the files of its work unit: (the run's directory, its seconds, a copy
    taken as soon as it finished). Tests that change the run's files use the copy or copy it again."""
    import shutil
    import time

    from workflow_testing import snakemake

    workdir = copy_workflow(tmp_path_factory.mktemp("smoke") / "amprepro")
    started = time.monotonic()
    result = snakemake(workdir, "--cores", "2", "--config", "preset=smoke")
    seconds = time.monotonic() - started
    (workdir.parent / "run.stderr").write_text(result.stderr)  # what the run said, beside its directory
    pristine = Path(shutil.copytree(workdir, tmp_path_factory.mktemp("smoke-copy") / "amprepro", symlinks=True))
    return workdir, seconds, pristine


@pytest.fixture
def workflow_copy(tmp_path: Path) -> Path:
    return copy_workflow(tmp_path / "amprepro")
