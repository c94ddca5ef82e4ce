"""Keep a CPU-heavy job beside the timed cells (the apex compile) on its own share of the machine's cores.

Snakemake counts threads; the operating system does not. Left alone, the apex build's 8 threads ran up to 14 compiler
processes per extension across all 16 CPUs of an H200 box, and the cells timed beside it slowed: on a fresh H200 at
4e89e88, vit_timm/amp_bf16 measured 0.80x the same cell on the same box once the build was over, its steps 49 ms
before the compile's processes reached its CPU and 56-78 ms after (results-reference/perf/4e89e88-h200/). So the build
is confined to the CPUs Snakemake gave it: whole physical cores where the topology says which logical CPUs share one
(a compiler on a hyperthread sibling still slows the cell's launch thread), at a lower priority (niceness), and the
cells keep the rest.

    share = plan_share(usable_cpus(), read_siblings(), count=8)   # the CPUs, or None: take every CPU (nothing to share)
    record = confine(8)                                           # apply it to this process (children inherit it)
"""

from __future__ import annotations

import os
from pathlib import Path

NICENESS = 10  # the build yields to the cells where they still meet (a shared sibling, an unread topology)
SYS_CPU = Path("/sys/devices/system/cpu")


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (a Slurm job or container may hold fewer than the machine has)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format: "0-3,8,10-11"."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def read_siblings(root: Path = SYS_CPU) -> dict[int, frozenset[int]]:
    """Each CPU's hyperthread siblings (itself included), from sysfs; {} where it cannot be read."""
    siblings: dict[int, frozenset[int]] = {}
    for path in root.glob("cpu[0-9]*/topology/thread_siblings_list"):
        try:
            cpu = int(path.parent.parent.name[3:])
            siblings[cpu] = frozenset(parse_cpu_list(path.read_text()))
        except (OSError, ValueError):
            return {}
    return siblings


def plan_share(usable: list[int], siblings: dict[int, frozenset[int]], count: int) -> list[int] | None:
    """count CPUs for the job, or None when it should take them all (it asked for as many as there are, or more).

    Whole cores from the top of the list, so the cells (which start on the low CPUs and stay where they are not
    crowded) keep whole cores too; a core only partly usable here counts with the CPUs it has. A count that ends inside
    a core gets the whole cores below it (one CPU fewer than counted: the build runs its jobs on those, and no cell
    shares a core with it); only a count smaller than any core takes single CPUs, splitting a core. Without a topology
    (siblings empty or not covering a CPU), each CPU is its own core."""
    if count >= len(usable) or count < 1:
        return None
    allowed = set(usable)
    cores = {frozenset(siblings.get(cpu, {cpu}) & allowed) or frozenset({cpu}) for cpu in usable}
    chosen: list[int] = []
    for group in sorted(cores, key=min, reverse=True):
        if len(chosen) + len(group) > count or not group.isdisjoint(chosen):
            continue  # a core that would overshoot (a smaller one further down may fit), or sysfs lists overlapping
        chosen.extend(group)
        if len(chosen) == count:
            break
    if not chosen:  # fewer CPUs than any core has: the top ones, splitting a core with the cells
        chosen = sorted(usable, reverse=True)[:count]
    return sorted(chosen)


def confine(count: int, niceness: int = NICENESS) -> dict:
    """Confine this process (and what it starts) to count CPUs at a lower priority; the record says what was done."""
    usable = usable_cpus()
    siblings = read_siblings()
    share = plan_share(usable, siblings, count)
    if share is None:
        return {"cpus": None, "usable": len(usable), "niceness": None,
                "why": f"{count} thread(s) asked for and {len(usable)} CPU(s) usable: nothing left to share"}
    record = {"cpus": share, "usable": len(usable), "topology": "sysfs thread siblings" if siblings else "unread",
              "niceness": None, "why": f"{count} of {len(usable)} CPUs, the rest left to the cells timed beside it"}
    try:
        os.sched_setaffinity(0, share)
    except (AttributeError, OSError) as exc:
        record.update(cpus=None, why=f"could not confine the build to its CPUs ({exc}); it may slow the cells")
    try:
        record["niceness"] = os.nice(niceness)
    except OSError as exc:
        record["why"] += f"; could not lower its priority ({exc})"
    return record
