"""A short probe of one cell for the memory plan: the real cell (amprepro.train.train) for PROBE_STEPS steps at the
batch and shape the plan is deciding on, under the same allocator cap the cells will have, in its own process (forked
from the cell server when `make run` started one, else a fresh interpreter), so an out-of-memory probe leaves nothing
behind in the plan's process (pytorch#18853: an exception keeps its tensors alive).

It fits when the cell's record says ok (the steps ran, including the optimizer step and the second forward: the peak
is reached by then, weights, optimizer state and activations all alive) and its allocator peak leaves the headroom
of amprepro.memory.HEADROOM (amprepro.plan.memplan decides that). Its record is kept under
results/plan/probes/ and in plan.json.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from amprepro.cellspec import CellSpec
from amprepro.files import read_json, write_json

PROBE_STEPS = 3  # the first step allocates the optimizer state; the second and third run with everything alive


class Prober:
    def __init__(self, folder: Path, machine: dict, threads: int = 1):
        self.folder, self.machine, self.threads = Path(folder), machine, threads
        self.count = 0
        if self.folder.is_dir():  # an earlier plan's probes: this plan replaces that plan and its records
            shutil.rmtree(self.folder)

    def run(self, spec: CellSpec) -> dict:
        self.count += 1
        name = f"{self.count:02d}-{spec.model}-{spec.precision}-{spec.batch_size}"
        out = self.folder / name
        out.mkdir(parents=True, exist_ok=True)
        probe_spec = spec.with_train(steps=PROBE_STEPS, warmup_steps=1)
        view = {"model": spec.model, "batch_size": spec.batch_size, "shape": spec.settings.shape,
                "fits": True, "why": "a memory-plan probe", "allocator_limit_bytes":
                self.machine.get("allocator_limit_bytes"), "cap_gib": self.machine.get("cap_gib"), "probe": True}
        write_json(out / "view.json", view)
        args = ["--spec", probe_spec.to_json(), "--plan", str(out / "view.json"), "--threads", str(self.threads),
                "--metrics", str(out / "metrics.json"), "--steps", str(out / "steps.csv")]
        code = run_cell(args, out / "probe.log")
        metrics = out / "metrics.json"
        if not metrics.exists():
            return {"status": "failed", "reason": f"the probe exited {code} without a record (see {out}/probe.log)"}
        return read_json(metrics)


def run_cell(args: list[str], log: Path) -> int:
    """The cell, forked from the cell server when there is one (amprepro.plan.cellserver), else in a fresh
    interpreter; its output goes to the probe's log."""
    from amprepro.plan import cellserver

    env = {k: v for k, v in os.environ.items() if k != cellserver.ORIGIN_ENV}  # a forked plan's, not the probe's
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "w") as handle:
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(handle.fileno(), 1)
            os.dup2(handle.fileno(), 2)
            code = cellserver.run_cell(args, env)
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            for signum, handler in handlers.items():  # run_cell forwarded them to the probe's process
                signal.signal(signum, handler)
        if code is None:
            code = subprocess.run([sys.executable, "-m", "amprepro.train.train", *args], stdout=handle,
                                  stderr=subprocess.STDOUT, env=env).returncode
    return code
