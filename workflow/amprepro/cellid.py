"""A cell's identity: its model (the config's name), precision and seed, spelled one way.

Every stage that keys cells (the summary's baselines and searches, the claims, the FP8 comparison, the reference, the
cell comparison) uses a CellId; its text form is `key`, "model/precision/seedN", the folder's own name under the runs
directory (`path`: results/runs/<model>/<precision>/seed<N>, where the train rule writes metrics.json and steps.csv).

One older spelling stays in files already committed: the reference's aggregate.json and each run's provenance.json
key cells "model/precision/N" (reference_key); from_key reads both. No torch import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

RUNS_DIR = Path("results/runs")
KEY = re.compile(r"(?P<model>[^/]+)/(?P<precision>[^/]+)/(?:seed)?(?P<seed>\d+)\Z")


@dataclass(frozen=True, order=True)
class CellId:
    model: str
    precision: str
    seed: int

    def __post_init__(self):
        object.__setattr__(self, "seed", int(self.seed))  # a CSV's or a wildcard's "0" is seed 0

    @classmethod
    def of(cls, record: Mapping) -> CellId:
        """The cell of anything that carries model, precision and seed: a summary row, a metrics.json, a spec, a
        config.cells() entry."""
        return cls(record["model"], record["precision"], record["seed"])

    @classmethod
    def from_key(cls, text: str) -> CellId:
        """From `key` ("m/p/seed0"), or the reference files' reference_key ("m/p/0")."""
        match = KEY.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a cell key: model/precision/seedN")
        return cls(match["model"], match["precision"], int(match["seed"]))

    @property
    def key(self) -> str:
        return f"{self.model}/{self.precision}/seed{self.seed}"

    @property
    def reference_key(self) -> str:
        """The key of the reference's committed files (aggregate.json, provenance.json's specs)."""
        return f"{self.model}/{self.precision}/{self.seed}"

    @property
    def path(self) -> Path:
        """Its folder under the pipeline's runs directory."""
        return self.under(RUNS_DIR)

    def under(self, runs_dir: str | Path) -> Path:
        """Its folder under another runs directory (a reference run, a test's)."""
        return Path(runs_dir) / self.model / self.precision / f"seed{self.seed}"

    def at(self, precision: str) -> CellId:
        """The same model and seed at another precision (a baseline's cell)."""
        return CellId(self.model, precision, self.seed)

    def __str__(self) -> str:
        return self.key
