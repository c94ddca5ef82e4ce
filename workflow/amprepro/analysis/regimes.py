"""The 7B memory claim in the setups where it could hold: one row per training regime, the FP32 peak and the AMP peak
that amprepro.memory predicts for one GPU's share, and the AMP saving (issue 25).

Every row is a prediction and says so. A row carries measured values only where a committed measurement file holds
both of its cells at exactly the row's setting: results-reference/regimes/<gpu-slug>.json, written on a GPU by
tools/gpu/regimes_run.sh, and for the setup the paper preset measures, the committed reference's llama7b cells
(reference/nvidia-h200/aggregate.json). The claim's own verdict (amprepro.analysis.claims) is untouched: this table is
context beside it, in the report's claim section and in verify.json.

The rows marked gpu=True are the ones tools/gpu/regimes_run.py measures on one H200 (141 GB); the others need more
GPUs or more memory than one H200 has, and stay predictions. Torch-free: the report and CI read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from amprepro import archs, memory
from amprepro.analysis.claimmetrics import fmt_value, verdict_for
from amprepro.memory import Lora, Sharding
from amprepro.modelsettings import ModelSettings

REPO = Path(__file__).resolve().parents[3]
MEASUREMENTS = REPO / "results-reference" / "regimes"
REFERENCE_AGGREGATE = REPO / "reference" / "nvidia-h200" / "aggregate.json"
MEASUREMENT_KIND = "amprepro regime measurements"
PART_KEYS = ("weights", "gradients", "optimizer_state", "master_weights", "activations_and_workspace")
LORA_RANK = 16
# The claims the table belongs to: a peak-memory claim about a LLaMA-7B-shaped model.
CLAIM_MODELS = {"llama7b", "llama"}


@dataclass(frozen=True)
class Side:
    """One cell of a regime: its precision and, for LoRA, the frozen base's dtype ("fp32" or "bf16")."""

    precision: str
    lora_base: str | None = None

    def label(self) -> str:
        name = memory.precision_of(self.precision).label
        return name + (f", frozen {'FP32' if self.lora_base == 'fp32' else 'bf16'} base" if self.lora_base else "")


@dataclass(frozen=True)
class Regime:
    key: str
    shape: str = "llama"
    batch: int = 1
    seq_len: int = archs.get("llama").seq_len
    checkpointing: bool = True
    sharding: Sharding = field(default_factory=Sharding)
    baseline: Side = Side("fp32")
    variant: Side = Side("apex_o1")
    lora_rank: int | None = None
    gpu: bool = False  # measured by tools/gpu/regimes_run.py on one H200
    note: str = ""

    def lora(self, side: Side) -> Lora | None:
        return Lora(rank=self.lora_rank, base=side.lora_base) if side.lora_base else None

    def estimate(self, side: Side) -> memory.Estimate:
        return memory.llama_estimate(self.shape, side.precision, self.batch, self.seq_len, self.checkpointing,
                                     sharding=self.sharding, lora=self.lora(side))

    def setting(self, side: Side) -> dict:
        """What a measured cell must match to stand for this side of the row."""
        return {"shape": self.shape, "precision": side.precision, "batch": self.batch, "seq_len": self.seq_len,
                "checkpointing": self.checkpointing, "ranks": self.sharding.ranks, "zero_stage": self.sharding.stage,
                "lora_rank": self.lora_rank if side.lora_base else None, "lora_base": side.lora_base}

    def text(self) -> str:
        what = f"LoRA r={self.lora_rank} on every linear of the blocks" if self.lora_rank else "full training"
        recompute = "checkpointing per block" if self.checkpointing else "no checkpointing"
        return (f"{memory.LLAMA_NAMES.get(self.shape, self.shape)}, {self.sharding.text()}, {what}, micro-batch "
                f"{self.batch} x {self.seq_len} tokens, {recompute}")


def _fsdp(ranks: int) -> Sharding:
    return Sharding(ranks=ranks, stage=3)


AMP = Side("amp_bf16")
TF32 = Side("tf32")
REGIMES = (
    Regime("7b-1gpu-mb1-ckpt-apex_o1", note="the setup the paper preset measures (the claim's verdict above)"),
    Regime("7b-1gpu-mb1-ckpt", baseline=TF32, variant=AMP, gpu=True,
           note="the same setup with torch.amp bf16, as the GPU regime run measures it"),
    Regime("7b-1gpu-mb8-ckpt", batch=8),
    Regime("7b-1gpu-mb1-nockpt", checkpointing=False, baseline=TF32, variant=AMP, gpu=True),
    Regime("7b-1gpu-mb4-nockpt", batch=4, checkpointing=False, note="more than one H200 holds"),
    Regime("3b-1gpu-mb4-nockpt", shape="openllama_3b", batch=4, checkpointing=False, baseline=TF32, variant=AMP,
           gpu=True, note="a larger micro-batch without checkpointing at a shape that fits one H200"),
    Regime("7b-zero1x8-mb1-ckpt", sharding=Sharding(8, 1), variant=AMP),
    Regime("7b-zero2x8-mb1-ckpt", sharding=Sharding(8, 2), variant=AMP,
           note="torch.amp's cast cache (a bf16 copy of every matmul weight) is not sharded"),
    Regime("7b-zero2x8-mb1-ckpt-o2", sharding=Sharding(8, 2), variant=Side("apex_o2"),
           note="16-bit weights, FP32 master weights and gradients partitioned (apex O2's bytes per parameter, as in "
                "ZeRO's mixed precision)"),
    Regime("7b-fsdpx8-mb1-ckpt", sharding=_fsdp(8), variant=AMP),
    Regime("7b-fsdpx8-mb4-nockpt", sharding=_fsdp(8), batch=4, checkpointing=False, variant=AMP),
    Regime("7b-fsdpx64-mb1-ckpt", sharding=_fsdp(64), variant=AMP),
    Regime("7b-fsdpx64-mb4-nockpt", sharding=_fsdp(64), batch=4, checkpointing=False, variant=AMP),
    Regime("7b-1gpu-mb1-ckpt-bf16w", baseline=TF32, variant=Side("bf16_weights"), gpu=True,
           note="bf16 weights and torch's fused AdamW on them: no FP32 master copy"),
    Regime("7b-1gpu-mb4-nockpt-bf16w", batch=4, checkpointing=False, variant=Side("bf16_weights")),
    Regime("7b-fsdpx64-mb4-nockpt-bf16w", sharding=_fsdp(64), batch=4, checkpointing=False,
           variant=Side("bf16_weights")),
    Regime("7b-lora-mb1-nockpt-fp32base", checkpointing=False, lora_rank=LORA_RANK, baseline=Side("tf32", "fp32"),
           variant=Side("amp_bf16", "fp32"), gpu=True, note="AMP over a frozen FP32 base"),
    Regime("7b-lora-mb1-nockpt-bf16base", checkpointing=False, lora_rank=LORA_RANK, baseline=Side("tf32", "fp32"),
           variant=Side("amp_bf16", "bf16"), gpu=True, note="the base held in bf16 under AMP"),
    Regime("7b-lora-mb4-nockpt-bf16base", batch=4, checkpointing=False, lora_rank=LORA_RANK,
           baseline=Side("fp32", "fp32"), variant=Side("amp_bf16", "bf16")),
)
BY_KEY = {r.key: r for r in REGIMES}
# Rows whose measured values come from the committed pipeline reference: regime -> (model, baseline, variant) cells.
REFERENCE_ROWS = {"7b-1gpu-mb1-ckpt-apex_o1": ("llama7b", "fp32", "apex_o1")}


class MeasurementError(ValueError):
    pass


# ----------------------------------------------------------------------------------------------------------------------
# Measurements


def measurement_files(folder: Path = MEASUREMENTS) -> list[Path]:
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def load_measurements(path: Path) -> dict:
    """A regime measurement file (tools/gpu/regimes_run.py): (regime key, "baseline"/"variant") -> its cell."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise MeasurementError(f"{path}: not a readable JSON file ({exc}); re-run tools/gpu/regimes_run.sh or remove "
                               "it") from exc
    if not isinstance(data, dict) or data.get("kind") != MEASUREMENT_KIND or not isinstance(data.get("cells"), list):
        raise MeasurementError(f"{path}: not a regime measurement file (needs kind {MEASUREMENT_KIND!r} and a list "
                               "of cells, as tools/gpu/regimes_run.py writes)")
    prov = data.get("provenance") or {}
    missing = [k for k in ("torch", "gpu", "date", "command") if not prov.get(k)]
    if missing:
        raise MeasurementError(f"{path}: provenance lacks {', '.join(missing)}: a measurement without its origin "
                               "cannot stand in the report")
    cells = {}
    for cell in data["cells"]:
        if not isinstance(cell, dict) or cell.get("side") not in ("baseline", "variant") or "regime" not in cell:
            raise MeasurementError(f"{path}: a cell without regime and side (baseline/variant): {str(cell)[:120]}")
        cells[(cell["regime"], cell["side"])] = {**cell, "source": str(path.relative_to(REPO) if path.is_relative_to(
            REPO) else path), "provenance": prov}
    return cells


def reference_cells(path: Path = REFERENCE_AGGREGATE) -> dict:
    """The committed pipeline reference's cells for REFERENCE_ROWS, where their settings are the row's."""
    if not path.exists():
        return {}
    cells = json.loads(path.read_text()).get("cells", {})
    out = {}
    for key, (model, base, variant) in REFERENCE_ROWS.items():
        regime = BY_KEY[key]
        for side, precision in (("baseline", base), ("variant", variant)):
            cell = cells.get(f"{model}/{precision}/0")
            if not cell or cell.get("status") != "ok":
                continue
            s = ModelSettings.of(cell["spec"]["model_config"])
            if (s.arch, s.shape or "llama", s.batch_size, s.seq_len, s.activation_checkpointing) != (
                    "llama", regime.shape, regime.batch, regime.seq_len, regime.checkpointing):
                continue
            out[(key, side)] = {"regime": key, "side": side, "status": "ok", "setting": regime.setting(
                getattr(regime, side)), "peak_allocated_bytes": int(cell["metrics"]["peak_allocated_bytes"]["median"]),
                "source": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)}
    return out


def all_measurements(folder: Path = MEASUREMENTS, aggregate: Path = REFERENCE_AGGREGATE) -> dict:
    cells = reference_cells(aggregate)
    for path in measurement_files(folder):
        cells.update(load_measurements(path))
    return cells


# ----------------------------------------------------------------------------------------------------------------------
# The table


def predicted_parts(e: memory.Estimate) -> dict:
    """The estimate split as measure.Breakdown splits a measured peak: the model states at the optimizer step
    (memory.Estimate.at_step: sharded, without the transient unsharded unit), and the rest of the peak."""
    parts = dict(e.at_step)
    return {**parts, "activations_and_workspace": e.total - sum(parts.values())}


def _measured(regime: Regime, measured: dict) -> tuple[dict | None, str]:
    cells = {side: measured.get((regime.key, side)) for side in ("baseline", "variant")}
    if not any(cells.values()):
        return None, ""
    for side, cell in cells.items():
        if cell is None:
            return None, f"measured {side} cell missing"
        if cell.get("setting") != regime.setting(getattr(regime, side)):
            return None, f"the measured {side} cell ran another setting ({cell.get('setting')}); not used"
        if cell.get("status") != "ok":
            return None, f"the measured {side} cell {cell.get('status')}: {cell.get('reason', '')}"
    b, v = cells["baseline"]["peak_allocated_bytes"], cells["variant"]["peak_allocated_bytes"]
    return {"baseline_peak_bytes": b, "variant_peak_bytes": v, "saving": 1 - v / b,
            "source": cells["variant"]["source"], "cells": cells}, ""


def row(regime: Regime, measured: dict | None = None, claim: dict | None = None) -> dict:
    base, var = regime.estimate(regime.baseline), regime.estimate(regime.variant)
    saving = 1 - var.total / base.total
    out = {"key": regime.key, "regime": regime.text(), "shape": regime.shape, "note": regime.note,
           "baseline": regime.baseline.label(), "variant": regime.variant.label(), "gpu_measurable": regime.gpu,
           "label": "predicted",
           "predicted": {"baseline_peak_bytes": base.total, "variant_peak_bytes": var.total, "saving": saving,
                         "baseline_parts": predicted_parts(base), "variant_parts": predicted_parts(var),
                         "baseline_moment": base.peak_moment, "variant_moment": var.peak_moment},
           "predicted_text": f"{fmt_value('memory_reduction', saving)} predicted",
           "measured": None, "measured_text": ""}
    if claim is not None:
        out["predicted_verdict"] = verdict_for(claim, saving)
    got, why = _measured(regime, measured or {})
    if got:
        out["measured"] = got
        out["label"] = "predicted; measured"
        out["measured_text"] = f"{fmt_value('memory_reduction', got['saving'])} measured ({got['source']})"
    elif why:
        out["measured_note"] = why
    return out


def table(claim: dict | None = None, measured: dict | None = None) -> list[dict]:
    measured = all_measurements() if measured is None else measured
    return [row(r, measured, claim) for r in REGIMES]


def applies_to(claim: dict) -> bool:
    return claim.get("metric") == "memory_reduction" and bool({m.lower() for m in claim.get("models", [])}
                                                              & CLAIM_MODELS)


def for_claim(claim: dict) -> dict | None:
    """What a claim's result carries (claims.evaluate_claim): the regimes table, or None for other claims. A bad
    measurement file is named in the result instead of stopping the report."""
    if not applies_to(claim):
        return None
    try:
        rows = table(claim)
        error = None
    except MeasurementError as exc:
        rows, error = table(claim, measured={}), str(exc)
    return {"intro": ("Predicted by amprepro.memory for one GPU's share (a prediction, not a measurement, unless "
                      "the row says measured): where an AMP saving near the claim's is possible."),
            "rows": rows, "measurement_error": error}


def lines(rows: list[dict]) -> list[str]:
    """One line a row, for verify's printout and the session note."""
    out = []
    for r in rows:
        p = r["predicted"]
        line = (f"{r['key']}: {r['baseline']} {memory.gib(p['baseline_peak_bytes'])} → {r['variant']} "
                f"{memory.gib(p['variant_peak_bytes'])}: {r['predicted_text']}")
        if r["measured"]:
            m = r["measured"]
            line += (f"; measured {memory.gib(m['baseline_peak_bytes'])} → {memory.gib(m['variant_peak_bytes'])}: "
                     f"{fmt_value('memory_reduction', m['saving'])}")
        out.append(line)
    return out


def main() -> None:
    for line in lines(table()):
        print(line)


if __name__ == "__main__":
    main()
