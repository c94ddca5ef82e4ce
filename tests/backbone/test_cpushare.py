"""The apex build's CPU share (amprepro.env.cpushare): whole cores from the top, the cells keep the rest."""

import json
import os
import subprocess
import sys

import pytest

from amprepro.env import apex_stage, cpushare

HT16 = {cpu: frozenset({cpu % 8, cpu % 8 + 8}) for cpu in range(16)}  # 8 cores, siblings n and n+8


def test_the_kernels_cpu_list_format_is_read():
    assert cpushare.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpushare.parse_cpu_list("5") == {5}


def test_whole_cores_from_the_top_so_no_cell_shares_a_core_with_the_build():
    share = cpushare.plan_share(list(range(16)), HT16, 8)
    assert share == [4, 5, 6, 7, 12, 13, 14, 15]
    cells = set(range(16)) - set(share)
    assert all(HT16[cpu] <= cells for cpu in cells)  # each cell CPU's sibling is a cell CPU too


def test_without_a_topology_each_cpu_is_a_core():
    assert cpushare.plan_share(list(range(16)), {}, 6) == [10, 11, 12, 13, 14, 15]


@pytest.mark.parametrize(("count", "share"), [(7, [5, 6, 7, 13, 14, 15]), (5, [6, 7, 14, 15]), (2, [7, 15])])
def test_a_count_that_ends_inside_a_core_leaves_that_core_to_the_cells(count, share):
    """apex_build_threads leaves 7 of 16 CPUs for the build on a one-GPU box: on two threads a core, 3 whole cores."""
    assert cpushare.plan_share(list(range(16)), HT16, count) == share
    cells = set(range(16)) - set(share)
    assert all(HT16[cpu] <= cells for cpu in cells)


def test_a_count_smaller_than_a_core_takes_single_cpus():
    assert cpushare.plan_share(list(range(16)), HT16, 1) == [15]  # the apex shell's one-thread build


def test_sibling_lists_that_overlap_never_give_a_cpu_twice():
    """sysfs covering only part of the CPUs, or lists that disagree: the share still has count distinct CPUs."""
    share = cpushare.plan_share([0, 1, 2, 3], {0: frozenset({0, 2}), 1: frozenset({1, 3}), 2: frozenset({0, 2})}, 3)
    assert len(share) == 3 and len(set(share)) == 3 and set(share) <= {0, 1, 2, 3}


def test_only_usable_cpus_are_chosen():
    usable = [0, 1, 2, 3, 8, 9]  # a container or Slurm job holding part of the machine
    share = cpushare.plan_share(usable, HT16, 3)  # CPUs 2 and 3 are cores of their own here; 3 would split 1/9
    assert share == [2, 3] and set(share) <= set(usable)
    assert cpushare.plan_share(usable, HT16, 4) == [1, 2, 3, 9]


@pytest.mark.parametrize("count", [16, 20, 0])
def test_a_build_that_asked_for_every_cpu_or_none_is_not_confined(count):
    assert cpushare.plan_share(list(range(16)), HT16, count) is None


def test_siblings_are_read_from_sysfs(tmp_path):
    for cpu, text in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1-3:2")):
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    assert cpushare.read_siblings(tmp_path) == {}  # an unreadable entry: no topology rather than a wrong one
    (tmp_path / "cpu3" / "topology" / "thread_siblings_list").write_text("1,3\n")
    assert cpushare.read_siblings(tmp_path) == {0: {0, 2}, 1: {1, 3}, 2: {0, 2}, 3: {1, 3}}


def test_confine_sets_the_affinity_and_lowers_the_priority(monkeypatch):
    seen = {}
    monkeypatch.setattr(cpushare, "usable_cpus", lambda: list(range(16)))
    monkeypatch.setattr(cpushare, "read_siblings", lambda: HT16)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: seen.setdefault("cpus", sorted(cpus)))
    monkeypatch.setattr(os, "nice", lambda n: seen.setdefault("nice", n) + 0)
    record = cpushare.confine(8)
    assert seen == {"cpus": [4, 5, 6, 7, 12, 13, 14, 15], "nice": cpushare.NICENESS}
    assert record["cpus"] == seen["cpus"] and record["usable"] == 16 and record["topology"] == "sysfs thread siblings"


def test_confine_says_when_it_could_not(monkeypatch):
    monkeypatch.setattr(cpushare, "usable_cpus", lambda: list(range(4)))
    monkeypatch.setattr(cpushare, "read_siblings", lambda: {})

    def refuse(pid, cpus):
        raise OSError("not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    monkeypatch.setattr(os, "nice", lambda n: n)
    record = cpushare.confine(2)
    assert record["cpus"] is None and "not permitted" in record["why"]


def test_the_build_job_records_its_share_and_its_children_inherit_it(tmp_path):
    """In a child interpreter (confining pytest itself would slow the rest of the suite): --cpu-share 1 on a machine
    with more than one usable CPU pins the stage and what it starts; a skipped build still says so."""
    if len(cpushare.usable_cpus()) < 2:
        pytest.skip("one usable CPU: nothing to share")
    out = tmp_path / "build.json"
    argv = ["--build-only", "--settings", json.dumps({"required": False, "source": {}}), "--out", str(out),
            "--jobs", "1", "--cpu-share", "1"]
    code = ("import os, subprocess, sys; from amprepro.env import apex_stage; "
            f"apex_stage.main({argv!r}); "
            "print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)), "
            "os.nice(0))'], capture_output=True, text=True).stdout)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["status"] == "skipped" and len(record["cpu_share"]["cpus"]) == 1
    niceness = min(19, os.nice(0) + cpushare.NICENESS)  # the kernel's ceiling, where the suite already runs niced
    assert done.stdout.strip().splitlines()[-1] == f"{record['cpu_share']['cpus']} {niceness}"


def test_the_build_rules_pass_their_threads_as_the_share():
    from pathlib import Path

    rules = (Path(apex_stage.__file__).resolve().parents[2] / "rules" / "apex.smk").read_text()
    assert rules.count("--cpu-share {threads}") == 2


def test_the_probes_settings_confine_the_busy_processes_as_the_build_is_and_pin_the_timed_one_to_the_rest():
    """tools/gpu/cpu_share_probe.py (run on a GPU box) compares these settings; on an H200 box's 16 CPUs."""
    from pathlib import Path

    sys.path.insert(0, str(Path(cpushare.__file__).resolve().parents[3] / "tools" / "gpu"))
    try:
        import cpu_share_probe
    finally:
        sys.path.pop(0)
    from amprepro.plan import resources

    settings = cpu_share_probe.settings_for(list(range(16)), HT16)
    build = cpushare.plan_share(list(range(16)), HT16, resources.apex_build_threads(16, 1))
    assert settings["quiet"] is None and settings["beside"] == (None, 0, None)
    assert settings["confined"] == (build, cpushare.NICENESS, None)
    assert settings["confined_cell_pinned"] == (build, cpushare.NICENESS, sorted(set(range(16)) - set(build)))
    assert len(settings["confined_quarter"][0]) == 4
