"""Whether one cell of the matrix can run here, and why not: the GPU, the GPU count, the apex build, a missing package
or a combination no machine runs; and which optimizer the cell uses (one of the things it may lack)."""

from __future__ import annotations

from amprepro.train import precisions


def cell_optimizer(train: dict, precision_name: str) -> str:
    """The optimizer this cell uses: train.apex_optimizer for the apex cells where it is set, else train.optimizer."""
    if precisions.get(precision_name).needs_apex and train.get("apex_optimizer"):
        return train["apex_optimizer"]
    return train["optimizer"]


def needs_apex(spec: dict) -> bool:
    """Whether the cell uses apex at all (amp, FusedAdam, FusedLayerNorm). A cell that does not never waits for the
    apex build: its job does not depend on it (workflow/rules/runs.smk)."""
    precision_name = spec["precision"]
    return (precisions.get(precision_name).needs_apex
            or cell_optimizer(spec["train"], precision_name) == "apex_fused_adam"
            or bool(spec["model_config"].get("fused_layer_norm")))


def optimizer_unsupported(name: str, device, apex: dict) -> str | None:
    if name == "apex_fused_adam" and (device.type != "cuda" or apex.get("status") != "built"):
        return "apex FusedAdam needs a CUDA GPU and a built apex"
    return None


def variant_unsupported(model_config: dict, precision_name: str, device, apex: dict) -> tuple[str, str, str] | None:
    """(skip_cause, what is missing, reason) for a model variant this machine or build cannot run, or None."""
    if model_config.get("fused_layer_norm") and apex.get("status") != "built":
        return "machine", "a built apex", "fused_layer_norm needs apex's FusedLayerNorm: apex is not built"
    if model_config.get("compile") and precisions.get(precision_name).needs_apex:
        return ("unsupported", "", "torch.compile with apex.amp is unsupported (O1 patches torch functions at run "
                "time)")
    return None


def skip_cause(spec: dict, device, apex: dict) -> tuple[str, str, str] | None:
    """Why this cell cannot run here: (skip_cause, what is missing, reason), or None.

    "machine": the GPU, the GPU count or the apex build lacks what the cell needs (verify: not comparable here);
    "software": a package the route should have installed is missing (verify: a failure, the install is wrong);
    "unsupported": a combination no machine runs (skipped in the reference too)."""
    from amprepro.train import models, precision

    model_config, train = spec["model_config"], spec["train"]
    reason = precision.unsupported_reason(spec["precision"], device, apex)
    if reason:
        return "machine", precision_needs(spec["precision"], device, apex), reason
    reason = models.unavailable_reason(model_config["arch"])
    if reason:
        return "software", "", reason
    reason = optimizer_unsupported(cell_optimizer(train, spec["precision"]), device, apex)
    if reason:
        return "machine", "a CUDA GPU and a built apex", reason
    return variant_unsupported(model_config, spec["precision"], device, apex)


def precision_needs(name: str, device, apex: dict) -> str:
    """The capability precision.unsupported_reason found missing, in a few words (its reason says more)."""
    if device.type != "cuda":
        return "a CUDA GPU"
    if precisions.get(name).needs_apex:
        return "apex.amp (apex ref 25.05)" if apex.get("status") == "built" else "a built apex"
    return "compute capability >= 8.0" if precisions.get(name).tf32 else "bf16 support"
