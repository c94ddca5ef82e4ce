"""The run matrix's cells: every (model, precision, seed) of the resolved runs, each cell's settings as one record
(amprepro.cellspec), and what the memory plan decides over."""

from __future__ import annotations

from amprepro.cellspec import CellSpec
from amprepro.modelsettings import MATRIX_KEYS
from amprepro.presets import deep_merge


def cells(runs: dict) -> list[dict]:
    """Every cell of models x precisions x seeds, in a stable order."""
    return [
        {"model": model, "precision": precision, "seed": seed}
        for model, settings in runs["models"].items()
        for precision in runs["precisions"]
        if precision in settings.get("precisions", runs["precisions"])
        for seed in settings.get("seeds", runs["seeds"])
    ]


def cell_spec(runs: dict, model: str, precision: str, seed: int) -> CellSpec:
    """Everything a single run needs: the settings of this cell only, so other cells' edits don't rerun it. Built
    once here, at DAG build time; every later stage reads this record (amprepro.cellspec). cell_spec_dict and
    cell_spec_json are its JSON forms."""
    settings = runs["models"][model]
    return CellSpec(model=model, precision=precision, seed=int(seed),
                    model_config={k: v for k, v in settings.items() if k not in MATRIX_KEYS},
                    train=deep_merge(runs["train"], settings.get("train", {})))


def cell_spec_dict(runs: dict, model: str, precision: str, seed: int) -> dict:
    return cell_spec(runs, model, precision, seed).as_dict()


def cell_spec_json(runs: dict, model: str, precision: str, seed: int) -> str:
    return cell_spec(runs, model, precision, seed).to_json()


def plan_cells(runs: dict, config: dict) -> list[dict]:
    """What the memory plan decides over: every cell's spec, and whether its model's batch is the preset's (an upper
    bound the plan may lower) or written in the user's config (kept as written)."""
    written = {name for name, settings in ((config.get("runs") or {}).get("models") or {}).items()
               if isinstance(settings, dict) and "batch_size" in settings}
    return [{"spec": cell_spec_dict(runs, c["model"], c["precision"], c["seed"]),
             "batch_source": "config" if c["model"] in written else "preset"} for c in cells(runs)]
