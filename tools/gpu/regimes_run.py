"""Measure the memory regimes of amprepro.analysis.regimes that one H200 can run (the rows with gpu=True), each cell in
a fresh process so its allocator peak is its own, and write one measurement file (issue 25).

    python3 tools/gpu/regimes_run.py run --out DIR [--budget-s 500] [--steps 16] [--regime KEY ...]
    python3 tools/gpu/regimes_run.py cell --regime KEY --side baseline|variant --steps N --json FILE   (one cell)

Each cell builds amprepro.train.models.Llama at the row's shape on the GPU, trains `steps` steps of one fixed batch
of synthetic tokens (amprepro.train.data.SyntheticTokens, seed 0; the same batch and initial weights for every cell of
a shape) with torch's fused AdamW (lr 1e-4, no weight decay), and records:
- the allocator peak over all steps (torch.cuda.max_memory_allocated) and the peak of each moment of the last step
  (forward, backward, optimizer step);
- the peak split into parts by amprepro.train.measure.Breakdown (weights, gradients, optimizer state counted tensor
  by tensor at the first step; the rest is activations and workspace);
- the loss of every step (bf16 weights with a bf16 AdamW against FP32 master weights: the same steps, the same data);
- the model's prediction for the same setting (amprepro.memory.llama_estimate), beside the measurement.
Precisions: tf32 (FP32 weights and compute with TF32 matmuls: strict FP32's memory, 4x faster), amp_bf16
(torch.autocast bf16 over FP32 weights: FP32 master weights), bf16_weights (the model cast to bf16, torch's fused
AdamW on the bf16 parameters: moments in bf16, no FP32 copy, no stochastic rounding). LoRA: peft's get_peft_model
with LoraConfig(r, lora_alpha=2r, lora_dropout=0, target_modules=the four linears of each block) on the materialised
base, held in FP32 or cast to bf16 first (peft keeps the adapters in FP32: autocast_adapter_dtype).

The file is written after every cell, so a run cut short keeps what it measured; a cell that fails (out of memory,
an import error) is recorded with its reason, never with a number.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "workflow"))

from amprepro import memory  # noqa: E402
from amprepro.analysis import regimes  # noqa: E402

LR = 1e-4


def gpu_rows(keys: list[str] | None) -> list[regimes.Regime]:
    rows = [r for r in regimes.REGIMES if r.gpu]
    if keys:
        unknown = sorted(set(keys) - {r.key for r in rows})
        if unknown:
            raise SystemExit(f"regimes_run: not a GPU regime: {', '.join(unknown)}; one of "
                             f"{', '.join(r.key for r in rows)}")
        rows = [r for r in rows if r.key in keys]
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# One cell (its own process)


def run_cell(regime: regimes.Regime, side_name: str, steps: int, device: str = "cuda") -> dict:
    """One cell's measurement. On a CPU (the smoke test) it trains the same way and records no memory."""
    import torch

    from amprepro.train import models
    from amprepro.train.data import SyntheticTokens
    from amprepro.train.measure import Breakdown
    from amprepro.train.train import cross_entropy

    side = getattr(regime, side_name)
    device = torch.device(device)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = side.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = side.precision == "tf32"
    torch.manual_seed(0)
    config = {"arch": "llama", "shape": regime.shape, "seq_len": regime.seq_len,
              "activation_checkpointing": regime.checkpointing}
    model = models.place(models.build("llama", config), device)
    if side.precision == "bf16_weights" or side.lora_base == "bf16":
        model = model.to(torch.bfloat16)
    peft_version = None
    if side.lora_base:
        import peft

        peft_version = peft.__version__
        for p in model.parameters():
            p.requires_grad_(False)
        model = peft.get_peft_model(model, peft.LoraConfig(r=regime.lora_rank, lora_alpha=2 * regime.lora_rank,
                                                           lora_dropout=0.0, target_modules=list(memory.LORA_TARGETS)))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.0, fused=cuda or None)
    breakdown = Breakdown(model, optimizer, enabled=cuda)
    data = SyntheticTokens(regime.batch, regime.seq_len, memory.LLAMA_SHAPES[regime.shape]["vocab_size"], 0, device)
    autocast = side.precision == "amp_bf16"
    losses, moments = [], {}
    def peak(moment: str | None) -> None:  # the allocator peak since the last call, under the moment just ended
        if cuda:
            torch.cuda.synchronize()
            if moment:
                moments[moment] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    peak(None)
    overall = 0
    for _ in range(steps):
        x, y = data.next()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = cross_entropy(model(x), y)
        peak("forward")
        loss.backward()
        peak("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        peak("optimizer step")
        overall = max(overall, *moments.values()) if moments else None
        losses.append(float(loss.detach()))
        del loss
    trainable_count = sum(p.numel() for p in trainable)
    predicted = regime.estimate(side)
    return {"status": "ok", "peak_allocated_bytes": overall,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
            "moments_last_step_bytes": moments, "parts": breakdown.result(overall), "losses": losses,
            "steps": steps, "trainable_parameters": trainable_count,
            "parameters": sum(p.numel() for p in model.parameters()),
            "parameter_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "trainable_dtypes": sorted({str(p.dtype) for p in trainable}),
            "optimizer": "torch.optim.AdamW(fused=True, lr=1e-4, weight_decay=0)",
            "optimizer_state_dtypes": sorted({str(t.dtype) for s in optimizer.state.values() for t in s.values()
                                              if hasattr(t, "dtype") and t.dim() > 0}),
            "peft": peft_version,
            "predicted": {**predicted.as_record(), "parts": regimes.predicted_parts(predicted)}}


# ----------------------------------------------------------------------------------------------------------------------
# The run: every GPU row's cells, each setting once


def provenance(argv: list[str]) -> dict:
    import torch

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python3", "tools/gpu/regimes_run.py", *argv]), "python": platform.python_version(),
            "git_commit": git("rev-parse", "HEAD") or None, "git_dirty": bool(git("status", "--porcelain")),
            "host": platform.node()}


def write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def run(args, argv: list[str]) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("regimes_run: no CUDA device here: nothing measured (this runs on the GPU box)", file=sys.stderr)
        return 2
    slug = "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name(0).lower()).strip("-")
    path = out / f"{slug}.json"
    data = {"kind": regimes.MEASUREMENT_KIND, "provenance": provenance(argv), "cells": []}
    start, done = time.monotonic(), {}
    for regime in gpu_rows(args.regime):
        for side_name in ("baseline", "variant"):
            setting = regime.setting(getattr(regime, side_name))
            key = json.dumps(setting, sort_keys=True)
            if key not in done:
                left = args.budget_s - (time.monotonic() - start)
                if left < 30:
                    done[key] = {"status": "not_run", "reason": f"the run's budget of {args.budget_s} s was spent"}
                else:
                    done[key] = measure(regime, side_name, args.steps, left, out)
                print(f"regimes_run: {regime.key}/{side_name} {setting['shape']} {setting['precision']}: "
                      f"{done[key]['status']} {done[key].get('peak_allocated_bytes', '')} "
                      f"({time.monotonic() - start:.0f} s)", flush=True)
            data["cells"].append({"regime": regime.key, "side": side_name, "setting": setting, **done[key]})
            write(path, data)
    print(f"regimes_run: {path}")
    return 0


def measure(regime, side_name: str, steps: int, left: float, out: Path) -> dict:
    result = out / f"cell-{regime.key}-{side_name}.json"
    log = out / "cells.log"
    began = time.monotonic()
    cmd = [sys.executable, str(Path(__file__).resolve()), "cell", "--regime", regime.key, "--side", side_name,
           "--steps", str(steps), "--json", str(result)]
    try:
        with log.open("a") as handle:
            handle.write(f"\n=== {regime.key}/{side_name}\n")
            handle.flush()
            proc = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, timeout=min(left, 240))
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"the cell ran past {min(left, 240):.0f} s"}
    seconds = round(time.monotonic() - began, 1)
    if result.exists():
        cell = json.loads(result.read_text())
        result.unlink()
        return {**cell, "wall_s": seconds}
    return {"status": "failed", "reason": f"exit code {proc.returncode}; see cells.log", "wall_s": seconds}


def cell_main(args) -> int:
    regime = regimes.BY_KEY[args.regime]
    try:
        record = run_cell(regime, args.side, args.steps)
    except Exception as exc:  # recorded, never a number: out of memory, a missing peft
        import torch

        status = "oom" if isinstance(exc, torch.OutOfMemoryError) else "failed"
        record = {"status": status, "reason": f"{type(exc).__name__}: {str(exc)[:400]}"}
    Path(args.json).write_text(json.dumps(record))
    return 0 if record["status"] == "ok" else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=500)
    r.add_argument("--steps", type=int, default=16)
    r.add_argument("--regime", action="append", help="only these GPU regimes (default: every one)")
    c = sub.add_parser("cell")
    c.add_argument("--regime", required=True, choices=[x.key for x in regimes.REGIMES if x.gpu])
    c.add_argument("--side", required=True, choices=["baseline", "variant"])
    c.add_argument("--steps", type=int, required=True)
    c.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.steps < 3:
            raise SystemExit("regimes_run: --steps must be at least 3 (the optimizer state exists from step 1 on)")
        gpu_rows(args.regime)
        return run(args, argv)
    return cell_main(args)


if __name__ == "__main__":
    sys.exit(main())
