"""runs.largest_batch: the models it may name, the searches it asks for, each search's share of the time budget."""

from __future__ import annotations

from amprepro import precisions
from amprepro.config.errors import ConfigError
from amprepro.config.matrix import cells
from amprepro.modelsettings import ModelSettings


def check_largest_batch(runs: dict) -> None:
    """runs.largest_batch names models this run has, each a single-GPU model that is not compiled (one process
    tries its batches)."""
    for model in (runs.get("largest_batch") or {}).get("models", []):
        settings = runs["models"].get(model)
        if settings is None:
            raise ConfigError(
                f"Config error at runs.largest_batch.models: {model} is not a model of this run "
                f"({', '.join(sorted(runs['models']))}). Fix: name one of them, or remove it.")
        given = ModelSettings.of_entry(settings)
        if given.gpus > 1 or given.nodes > 1 or given.compile:
            raise ConfigError(
                f"Config error at runs.largest_batch.models: {model} is data-parallel or compiled; the search tries "
                "batches in one process, one step each. Fix: name its single-GPU, uncompiled model instead.")


def largest_batch_searches(runs: dict) -> list[dict]:
    """{model, precision, seed} of every search runs.largest_batch asks for: the model's first seed's cells (of
    runs.largest_batch.precisions where it names them; issue 40: searches no claim reads cost GPU time; a named
    precision that none of the models runs, say after a runs.precisions override, is searched nowhere), except the
    compiled precisions (FP8, compiled bf16: one step per try would time the compiler, and the search builds the model
    eagerly)."""
    asked = runs.get("largest_batch") or {}
    models, only = asked.get("models", []), asked.get("precisions")
    return [c for c in cells(runs) if c["model"] in models and not precisions.get(c["precision"]).compile
            and (only is None or c["precision"] in only)
            and c["seed"] == runs["models"][c["model"]].get("seeds", runs["seeds"])[0]]


# A baseline's search (strict FP32, TF32) counts this many shares of runs.largest_batch.seconds, any other search one:
# the baseline's answer is the denominator of every ratio and must be exact, and its tries are the slowest (2-3x an
# AMP try on the H200 at 80 GiB: ViT-B/16 FP32 1.9 s at batch 616, apex O1 1.0 s at 936, 2026-12-01).
BASELINE_SEARCH_SHARES = 2
BASELINE_SEARCH_PRECISIONS = ("fp32", "tf32")


def largest_batch_seconds(searches: list[dict], total: float, precision: str) -> float:
    """Seconds of trial steps one search of `precision` may spend: runs.largest_batch.seconds shared by the run's
    searches, a baseline's search counting BASELINE_SEARCH_SHARES."""
    def shares(name: str) -> int:
        return BASELINE_SEARCH_SHARES if name in BASELINE_SEARCH_PRECISIONS else 1

    return round(total * shares(precision) / max(1, sum(shares(c["precision"]) for c in searches)), 2)
