"""Whether one cell of the matrix can run here, and why not: the GPU, the GPU count, the apex build, a missing package
or a combination no machine runs; and which optimizer the cell uses (one of the things it may lack)."""

from __future__ import annotations

from amprepro import apexexts, precisions
from amprepro.cellspec import CellSpec
from amprepro.modelsettings import ModelSettings


def cell_optimizer(train: dict, precision_name: str) -> str:
    """The optimizer this cell uses: train.apex_optimizer for the apex cells where it is set, else train.optimizer."""
    return CellSpec("", precision_name, 0, {}, train).optimizer


def needs_apex(spec: CellSpec | dict) -> bool:
    """Whether the cell uses apex at all (amp, FusedAdam, FusedLayerNorm): CellSpec.needs_apex."""
    return CellSpec.of(spec).needs_apex


def optimizer_unsupported(name: str, device, apex: dict) -> str | None:
    if name == "apex_fused_adam" and (device.type != "cuda" or apex.get("status") != "built"):
        return "apex FusedAdam needs a CUDA GPU and a built apex"
    return None


def apex_build_mismatch(spec: CellSpec, apex: dict) -> str | None:
    """A cell given the other apex build than its model's apex_build asks for (the DAG wires the right one: only a
    hand-run cell gets here). A shell must never stand in for the full build, which the articles' numbers need."""
    if not spec.needs_apex or apex.get("status") != "built":
        return None
    given = "shell" if apex.get("shell") else "full"
    if given == spec.apex_build:
        return None
    return (f"this cell asks for the {spec.apex_build} apex build (apex_build: {spec.apex_build}) but was given the "
            f"{given} one; run it through Snakemake, or pass --apex {spec.apex_view}")


def extensions_missing(spec: CellSpec, apex: dict) -> str | None:
    """The full build compiles only the extensions its run matrix's cells use (amprepro.apexexts): a cell outside that
    matrix (a hand-run cell, a matrix changed without rebuilding) may need one it left out."""
    missing = apexexts.missing(spec, apex)
    if not missing:
        return None
    return (f"this cell needs apex's {', '.join(missing)}, which this apex build left out (it built only "
            f"{', '.join(apex['extensions_built']) or 'none'}: the extensions the cells of its run matrix use, "
            "amprepro.apexexts). Fix: put this cell in the run matrix (config runs) and run Snakemake, which rebuilds "
            "apex with it (rule apex_build, results/apex/build.json)")


def shell_refusal(spec: CellSpec, apex: dict) -> str | None:
    """In the apex shell, what apex itself says when the cell's fused module is constructed: FusedAdam raises "apex.
    optimizers.FusedAdam requires cuda extensions" (no amp_C), FusedLayerNorm "No module named 'fused_layer_norm_cuda'".
    Tried for real, on the CPU before any CUDA work, so the skip quotes apex; None where apex builds it after all."""
    if not apex.get("shell") or apex.get("status") != "built":
        return None
    try:
        if spec.optimizer == "apex_fused_adam":
            import torch
            from apex.optimizers import FusedAdam

            FusedAdam([torch.nn.Parameter(torch.zeros(1))])
        if spec.settings.fused_layer_norm:
            from apex.normalization import FusedLayerNorm

            FusedLayerNorm(8)
    except (ImportError, RuntimeError) as exc:
        what = "FusedAdam" if spec.optimizer == "apex_fused_adam" else "FusedLayerNorm"
        return (f"apex {what} cannot run in the apex shell (built without --cpp_ext/--cuda_ext): apex says "
                f"{type(exc).__name__}: {exc}")
    return None


def variant_unsupported(settings: ModelSettings | dict, precision_name: str, device, apex: dict
                        ) -> tuple[str, str, str] | None:
    """(skip_cause, what is missing, reason) for a model variant this machine or build cannot run, or None."""
    from amprepro.train import imagedata

    settings = ModelSettings.of(settings)
    reason = imagedata.unavailable_reason(settings)
    if reason:
        return "machine", "the dataset", reason
    if settings.fused_layer_norm and apex.get("status") != "built":
        return "machine", "a built apex", "fused_layer_norm needs apex's FusedLayerNorm: apex is not built"
    if settings.compile and precisions.get(precision_name).needs_apex:
        return ("unsupported", "", "torch.compile with apex.amp is unsupported (O1 patches torch functions at run "
                "time)")
    return None


def skip_cause(spec: CellSpec | dict, device, apex: dict) -> tuple[str, str, str] | None:
    """Why this cell cannot run here: (skip_cause, what is missing, reason), or None.

    "machine": the GPU, the GPU count or the apex build lacks what the cell needs (verify: not comparable here);
    "software": a package the route should have installed is missing (verify: a failure, the install is wrong);
    "unsupported": a combination no machine runs (skipped in the reference too)."""
    from amprepro.train import float8, models, precision

    spec = CellSpec.of(spec)
    reason = apex_build_mismatch(spec, apex)
    if reason:
        return "software", "the apex build its model asks for", reason
    reason = extensions_missing(spec, apex)
    if reason:
        return "software", "apex extensions its build left out", reason
    reason = precision.unsupported_reason(spec.precision, device, apex)
    if reason:
        return "machine", precision_needs(spec.precision, device, apex), reason
    reason = float8.unavailable_reason(spec.precision)  # torchao is pinned in every route that runs FP8 cells
    if reason:
        return "software", "torchao", reason
    reason = models.unavailable_reason(spec.arch)
    if reason:
        return "software", "", reason
    reason = optimizer_unsupported(spec.optimizer, device, apex)
    if reason:
        return "machine", "a CUDA GPU and a built apex", reason
    reason = variant_unsupported(spec.settings, spec.precision, device, apex)
    if reason:
        return reason
    reason = shell_refusal(spec, apex)  # the shell lacks the kernel on every machine: skipped in the reference too
    return ("unsupported", "apex's CUDA extensions", reason) if reason else None


def precision_needs(name: str, device, apex: dict) -> str:
    """The capability precision.unsupported_reason found missing, in a few words (its reason says more)."""
    if device.type != "cuda":
        return "a CUDA GPU"
    if precisions.get(name).needs_apex:
        return "apex.amp (apex ref 25.05)" if apex.get("status") == "built" else "a built apex"
    needed = precisions.get(name).min_capability
    if needed:
        return f"compute capability >= {'.'.join(map(str, needed))}"
    return "compute capability >= 8.0" if precisions.get(name).tf32 else "bf16 support"
