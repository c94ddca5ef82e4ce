"""Times the pipeline's own FP32 training step on the CPU under whichever interpreter runs this file; one cell per
process, one JSON line on stdout.

Why this file: the third article says Python 3.11 runs 25-60 % faster than 3.10 and that deep learning, which builds
graphs and dispatches tensor ops, gains from it. The step timed here is the pipeline's (amprepro.train: the model
from models.build via train.prepare_model, the batches from train.make_data, AdamW from train.make_optimizer, the
loss train.cross_entropy, and precision.Trainer.step: forward, loss, backward, optimizer step, zero_grad), so the
interpreter is the only thing that changes between two runs of this file with the same torch build.

Two kinds of cell (CELLS): launch-bound (the digits transformer at batch 8: hundreds of tiny ops a step, where
Python and the dispatcher dominate) and compute-bound (the byte-level GPT at batch 8 x 128 tokens: matmuls
dominate). torch runs on one thread (torch.set_num_threads(1)) so a step does not compete with itself for the
machine's cores. The first `warmup` steps are not timed; each timed step is timed on its own, in wall time
(time.perf_counter) and in the process's CPU time (time.process_time: every thread of the process, on a CPU only
while it runs), and the line carries their medians and 10th percentiles. On a machine shared with other work the
wall time counts the neighbours too (a step waits while they run); the CPU time counts the step's own work.

Run with PYTHONPATH=<repo>/workflow: python bench.py --cell launch_tiny_transformer --steps 300 --warmup 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import sysconfig
import time

CELLS = {
    # name: (kind, model_config)
    "launch_tiny_transformer": ("launch-bound", {"arch": "tiny_transformer", "data": "digits", "batch_size": 8}),
    "compute_gpt_bytes": ("compute-bound", {"arch": "gpt_bytes", "data": "synthetic_tokens", "batch_size": 8,
                                            "seq_len": 128}),
}
# A positive control, no torch: the kind of pure-Python work (calls, attribute access, small objects) the
# interpreter benchmarks the article cites measure. It shows whether these two builds differ the way the article says
# at all, apart from what a training step makes of it; the claim's verdict does not read it.
CONTROL = "control_pure_python"
LR = 0.002  # config/presets/smoke.yaml's; the value does not change the work of a step


def interpreter() -> dict:
    """The running interpreter as the evidence records it: version, implementation, how it was built."""
    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "build": " ".join(platform.python_build()), "compiler": platform.python_compiler(),
            "executable": sys.executable, "base_prefix": sys.base_prefix,
            "config_args": sysconfig.get_config_var("CONFIG_ARGS") or "",
            "opt": sysconfig.get_config_var("OPT") or "",
            "pgo_lto": {"pgo": "--enable-optimizations" in (sysconfig.get_config_var("CONFIG_ARGS") or ""),
                        "lto": "--with-lto" in (sysconfig.get_config_var("CONFIG_ARGS") or "")}}


def _fib(n: int) -> int:
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)


class _Point:
    def __init__(self, x: float, y: float):
        self.x, self.y = x, y

    def manhattan(self) -> float:
        return abs(self.x) + abs(self.y)


def control_step() -> float:
    """One step of the control: recursive calls, then small objects and their methods."""
    total = float(_fib(18))
    for i in range(3000):
        total += _Point(i, -i).manhattan()
    return total


def run_control(steps: int, warmup: int) -> dict:
    times, cpu_times = [], []
    for step in range(warmup + steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        control_step()
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if step >= warmup:
            times.append(elapsed)
            cpu_times.append(elapsed_cpu)
    from amprepro.analysis.pythonclaim import CONTROL_KIND

    return {"cell": CONTROL, "kind": CONTROL_KIND, "model_config": None, "steps": steps, "warmup_steps": warmup,
            **step_stats(times, cpu_times), "python": interpreter(), "loadavg_1m": os.getloadavg()[0]}


def step_stats(times: list[float], cpu_times: list[float]) -> dict:
    return {"median_step_s": statistics.median(times), "mean_step_s": statistics.fmean(times),
            "min_step_s": min(times), "p10_step_s": statistics.quantiles(times, n=10, method="inclusive")[0],
            "median_step_cpu_s": statistics.median(cpu_times),
            "p10_step_cpu_s": statistics.quantiles(cpu_times, n=10, method="inclusive")[0]}


def run_cell(cell: str, steps: int, warmup: int, seed: int = 0) -> dict:
    import torch

    from amprepro.train import precision, train

    torch.set_num_threads(1)
    kind, model_config = CELLS[cell]
    train.seed_everything(seed, False)
    device = torch.device("cpu")
    model, _ = train.prepare_model(model_config, device)
    optimizer = train.make_optimizer("adamw", model.parameters(), LR, 0.0, device)
    trainer = precision.Trainer("fp32", model, optimizer, train.cross_entropy, device)
    batches = train.make_data(model_config, seed, device, model)
    times, cpu_times, losses = [], [], []
    for step in range(warmup + steps):
        x, y = batches.next()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = trainer.step(x, y)
        loss = float(result.loss)  # the step's value is read, so the timed step is the whole step
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if step >= warmup:
            times.append(elapsed)
            cpu_times.append(elapsed_cpu)
            losses.append(loss)
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        raise SystemExit(f"{cell}: a non-finite loss; the timing of a broken step is not evidence")
    return {"cell": cell, "kind": kind, "model_config": model_config, "optimizer": "adamw", "precision": "fp32",
            "steps": steps, "warmup_steps": warmup, **step_stats(times, cpu_times),
            "first_loss": losses[0], "last_loss": losses[-1],
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_threads": torch.get_num_threads(),
            "python": interpreter(), "loadavg_1m": os.getloadavg()[0]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", required=True, choices=sorted([*CELLS, CONTROL]))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--label", required=True, help="the interpreter's name in the evidence (py310, py311)")
    args = parser.parse_args(argv)
    if args.steps < 5 or args.warmup < 1:
        parser.error("--steps must be at least 5 and --warmup at least 1: a median of fewer steps, or a timed "
                     "first step, is not a step time")
    run = run_control if args.cell == CONTROL else lambda steps, warmup: run_cell(args.cell, steps, warmup)
    print(json.dumps({"label": args.label, **run(args.steps, args.warmup)}))


if __name__ == "__main__":
    main()
