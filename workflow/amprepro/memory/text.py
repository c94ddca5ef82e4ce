"""The memory model in words: bytes as GiB, an estimate by part."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amprepro.memory.cellpeak import Estimate

GIB = 2**30


def gib(n: int | float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


def describe(e: Estimate) -> str:
    return describe_record(e.as_record())


def describe_record(r: dict) -> str:
    """An estimate (Estimate.as_record(), as metrics.json and plan.json carry it) in words."""
    return (f"estimated peak {gib(r['total_bytes'])} at the {r['peak_moment']} (weights {gib(r['weights_bytes'])}, "
            f"gradients {gib(r['gradients_bytes'])}, optimizer state {gib(r['optimizer_state_bytes'])}, master "
            f"weights {gib(r['master_weights_bytes'])}, cast cache {gib(r['cast_cache_bytes'])}, activations "
            f"{gib(r['activations_bytes'])}, workspace {gib(r['workspace_bytes'])})")
