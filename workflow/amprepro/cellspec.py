"""A cell's settings as one typed record, built once from the run matrix (at DAG build time) and read by every stage
after it: the rules (its JSON is the train job's --spec), the memory plan, the cell itself, verify and the report.

The model's settings are a typed record too (`settings`: amprepro.modelsettings.ModelSettings, defaults applied once
from the arch registry); stages read its fields. The JSON form (as_dict; its model_config written back from that record,
key for key as the config wrote it) is what metrics.json's "spec" and the reference's aggregate carry. The plan's
decision (the batch and shape this GPU runs the model at, and why) is applied once, in the cell, by planned(): the
record then says both what was asked for and what ran.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

from amprepro import precisions
from amprepro.modelsettings import ModelSettings

# Model settings the memory plan may change; everything else in model_config is the config's, as written.
PLANNED_KEYS = ("batch_size", "shape")
# The view of each apex build that the cells read (amprepro.runinputs; workflow/rules/apex.smk writes them): model
# setting apex_build picks one. The shell is the same source built without --cpp_ext/--cuda_ext (issue 38).
APEX_VIEWS = {"full": "results/apex/runs.json", "shell": "results/apex/shell-runs.json"}


@dataclass(frozen=True)
class CellSpec:
    model: str
    precision: str
    seed: int
    model_config: dict = field(default_factory=dict)  # the JSON form, as the config wrote it (settings' as_dict())
    train: dict = field(default_factory=dict)
    # The model settings as a typed record, defaults applied (amprepro.modelsettings): built once, from model_config,
    # when the spec is; every stage reads it rather than the dict.
    settings: ModelSettings = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "settings", ModelSettings.of(self.model_config))

    @classmethod
    def of(cls, value: CellSpec | dict) -> CellSpec:
        """The record from itself or from its JSON form (metrics.json, a test, a tool)."""
        if isinstance(value, CellSpec):
            return value
        return cls(model=value.get("model", ""), precision=value["precision"], seed=int(value.get("seed", 0)),
                   model_config=copy.deepcopy(value.get("model_config") or {}),
                   train=copy.deepcopy(value.get("train") or {}))

    @classmethod
    def from_json(cls, text: str) -> CellSpec:
        return cls.of(json.loads(text))

    def as_dict(self) -> dict:
        return {"model": self.model, "precision": self.precision, "seed": self.seed,
                "model_config": copy.deepcopy(self.settings.as_dict()), "train": copy.deepcopy(self.train)}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @property
    def arch(self) -> str:
        return self.settings.arch

    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def optimizer(self) -> str:
        """train.apex_optimizer for the apex cells where it is set, else train.optimizer."""
        if precisions.get(self.precision).needs_apex and self.train.get("apex_optimizer"):
            return self.train["apex_optimizer"]
        return self.train["optimizer"]

    @property
    def needs_apex(self) -> bool:
        """Whether the cell uses apex at all (amp, FusedAdam, FusedLayerNorm). A cell that does not never waits for
        the apex build: its job does not depend on it (workflow/rules/runs.smk)."""
        return (precisions.get(self.precision).needs_apex or self.optimizer == "apex_fused_adam"
                or self.settings.fused_layer_norm)

    @property
    def apex_build(self) -> str:
        """full (the default) or shell: which apex build the cell runs on (APEX_VIEWS)."""
        return self.settings.apex_build

    @property
    def apex_view(self) -> str | None:
        """The apex view (runs.json) this cell's job reads and waits for; None for a cell that uses no apex."""
        return APEX_VIEWS[self.apex_build] if self.needs_apex else None

    def planned(self, plan: dict | None) -> CellSpec:
        """This spec at the batch and shape the memory plan chose for its model (its per-model view)."""
        if not plan:
            return self
        config = dict(self.model_config)
        config["batch_size"] = plan["batch_size"]
        if plan.get("shape"):
            config["shape"] = plan["shape"]
        return CellSpec(self.model, self.precision, self.seed, config, copy.deepcopy(self.train))

    def with_train(self, **changes) -> CellSpec:
        return CellSpec(self.model, self.precision, self.seed, copy.deepcopy(self.model_config),
                        {**copy.deepcopy(self.train), **changes})
