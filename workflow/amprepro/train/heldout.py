"""The held-out loss of a cell, evaluated at intervals while it trains (model_config eval_every): the curve the
convergence verdict (amprepro.analysis.convergence) and the report's loss-curve section read.

The held-out set is the data's own test_set() (the stdlib corpus's fixed held-out windows, the same for every seed and
precision). The loss is the mean cross-entropy per target (nats per byte for the text model), computed from the
cell's own forward (trainer.logits: the precision's autocast, as eval_accuracy is) with the logits in FP32, in chunks
so that a large vocabulary does not need one big logits tensor. Evaluations are outside the timed step.
"""

from __future__ import annotations

import math

EVAL_CHUNK = 16  # held-out windows per forward
DESCRIPTION = ("mean cross-entropy per target token over the data's fixed held-out set (nats), from the cell's own "
               "precision's forward (autocast where it has one), logits in FP32; evaluated outside the timed steps")


def heldout_loss(trainer, batches) -> float | None:
    import torch.nn.functional as F

    test = batches.test_set()
    if test is None:
        return None
    x, y = test
    total, count = 0.0, 0
    for start in range(0, len(x), EVAL_CHUNK):
        logits = trainer.logits(x[start:start + EVAL_CHUNK])
        target = y[start:start + EVAL_CHUNK]
        total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                                       reduction="sum"))
        count += target.numel()
    trainer.zero_grad()  # also empties apex O1's cast cache, which the evaluation's forward filled
    return total / count


def eval_points(steps: int, every: int) -> list[int]:
    """Optimizer steps done at each evaluation: 0 (before training), every `every` steps, and the last step."""
    points = list(range(0, steps + 1, every))
    return points if points[-1] == steps else [*points, steps]


class Curve:
    """Collects (steps done, held-out loss) during a cell's loop; off (records nothing) when every is None."""

    def __init__(self, steps: int, every: int | None):
        self.every = every
        self.points = set(eval_points(steps, every)) if every else set()
        self.rows: list[dict] = []

    def maybe(self, steps_done: int, trainer, batches) -> None:
        if steps_done in self.points:
            loss = heldout_loss(trainer, batches)
            if loss is not None:
                self.rows.append({"step": steps_done, "loss": loss})

    def fields(self) -> dict:
        """What metrics.json records: the curve, its last point and how it was computed; nothing when off."""
        if not self.every:
            return {}
        final = self.rows[-1]["loss"] if self.rows else None
        return {"heldout_curve": self.rows, "heldout_loss_final": final if final is None or math.isfinite(final)
                else None, "heldout_eval": {"every": self.every, "what": DESCRIPTION}}
