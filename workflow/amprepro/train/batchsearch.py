"""The largest batch one precision of a model fits on this card ("with AMP you can use a bigger batch").

    python -m amprepro.train.batchsearch --spec SPEC_JSON --cell METRICS_JSON --plan VIEW_JSON [--apex APEX_JSON]
        --up-to 8 --seconds S --out results/largest_batch/<model>/<precision>.json

One process per precision (apex O1 patches torch for the whole process). It builds its trial through the cell's own
factory, amprepro.train.cell.build_cell (the model, FP8 conversion, optimizer, the precision with its GradScaler or
apex amp.initialize, channels_last, the compile where the precision compiles), and its batches through Cell.inputs, so
it measures what the cell runs. It tries the planned batch first (one step: the cell ran there), then tries larger
batches, STEPS_PER_TRY training steps each, under the same allocator cap as the cells (gpu_memory_limit_gib). Every
try starts as a fresh cell's steps do: no gradients, no optimizer state (its first step allocates them), the cache
emptied. A batch fits when its steps finish with their allocator peak at most amprepro.memory.HEADROOM of the budget
(a margin for what a cell's later steps need beyond the try's); an allocation failure (CUDA OOM, cuBLAS/cuDNN
ALLOC_FAILED) or a peak above that means it does not, and everything it held is freed before the next try.

The search (search()) is bounded: batches on the planned batch's grid (multiples of 8 where it is one), at most
`up_to` times the planned batch, and at most `seconds` of trial steps. It starts from a guess (the memory model's
estimate scaled to this cell's measured peak at the planned batch), then, if that fits, tries the batch the model
expects just not to fit, so that two tries usually bracket the answer; it walks on in steps of 1, 2, 4 ... grid steps
while every try went one way, then bisects. A search its time cuts short still leaves an interval (the largest batch
that fitted, the smallest that failed), which bounds the ratios the report and the claim compute.
Its answer says how it ended: exact (the next batch on the grid did not fit), capped (fits at up_to times the planned
batch; the true largest may be higher) or at_least (the time ran out first). Every try is recorded: batch, fits or
not, allocator peak, seconds.

After an out-of-memory try the process goes on; fragmentation left by it can only make a later try fail that a fresh
process would fit, so the answer errs low, never high.

Compiled precisions and compiled models are not searched: amprepro.config.largest_batch_searches leaves them out (a
try's steps would time the compiler). A search started for one anyway builds it compiled, as its cell runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time
from dataclasses import dataclass, field

from amprepro.cellspec import CellSpec
from amprepro.files import read_json, write_json
from amprepro.modelsettings import ModelSettings

# The guess aims this far below the budget, under HEADROOM (a try over it does not fit): scaled to the cell's measured
# peak, the estimate was within 3 % of the tries' peaks on the H200 at 48 GiB (2026-12-01).
GUESS_MARGIN = 0.93
# Training steps per try: the second one meets what the first left in the allocator's cache. On the H200 under a
# 3 GiB cap (tests/gpu/test_batchsearch_gpu.py, 2026-12-01) the answers of one-step tries (ViT-B/16 FP32 14, bf16 24)
# ran out of memory at a fresh cell's second step, with their allocated peak under HEADROOM and 222-316 MiB reserved
# but unallocated: fragmentation, which one step does not show. With two steps (2026-12-02) they still did, and with
# forget_optimizer_state too (2026-12-03: answers FP32 15, bf16 24; 2.78 and 2.71 GiB allocated, 213 and 222 MiB
# reserved but unallocated at the fresh cell's second step). Under so small a cap the cache's fragmentation is 7-10 %
# of the budget, more than HEADROOM leaves; the answers are the search process's reading, not a fresh cell's.
STEPS_PER_TRY = 2


def forget_optimizer_state(optimizer) -> None:
    """Drop the optimizer's per-parameter state (AdamW's moments), so that a try's first step allocates it after its
    activations are freed, as a fresh cell's first step does. The GPU test at a 3 GiB cap (2026-12-02) had answers
    whose two-step tries fitted, with the state allocated once by the warm try, then ran out of memory at a fresh
    cell's second step (2.65 GiB allocated, 264-316 MiB reserved but unallocated): a state allocated into the holes
    the first step's activations left fragments the cache differently. torch's and apex's Adam(W) build a missing
    state at their next step."""
    optimizer.state.clear()
# The try after a fitting guess aims just over this share of the budget (a little above HEADROOM, where a try stops
# fitting), so that the guess and it bracket the answer in two tries; a strict-FP32 search, the slowest, then has a
# batch that fails even when its time runs out before the bisection, and the ratios it is the denominator of are
# bounded (amprepro.analysis.claimmetrics.batch_ratio).
OVER_MARGIN = 0.97


@dataclass
class Search:
    """The state and answer of one search; batches fit at `largest` and not at `smallest_failing`."""

    planned: int
    up_to: int
    step: int
    largest: int
    smallest_failing: int | None = None
    tries: list = field(default_factory=list)
    bound: str = ""
    why: str = ""

    def as_record(self) -> dict:
        return {"planned_batch": self.planned, "up_to_batch": self.up_to, "grid_step": self.step,
                "largest_batch": self.largest, "smallest_failing_batch": self.smallest_failing, "bound": self.bound,
                "why": self.why, "tries": self.tries,
                "trial_seconds": round(sum(t["seconds"] for t in self.tries), 3)}


def grid_step(planned: int) -> int:
    return 8 if planned % 8 == 0 else 1


def snap(batch: int, step: int) -> int:
    return max(step, batch // step * step)


def next_batch(s: Search, guess: int, over: int | None = None) -> int:
    """The next batch to try, strictly between what fits and what does not (or up to the cap): the guess first; if it
    fits, the batch the memory model expects not to fit (over), so that two tries bracket the answer; then, while every
    try went one way, steps of 1, 2, 4 ... grid steps from the last one in that direction; once a fit and a failure
    bracket the answer, bisection."""
    high = s.up_to if s.smallest_failing is None else s.smallest_failing - s.step
    outcomes = {t["fits"] for t in s.tries}
    stride = s.step * 2 ** (len(s.tries) - 1)
    if not s.tries:
        wanted = guess
    elif outcomes == {True} and len(s.tries) == 1 and over is not None and over > s.largest:
        wanted = over
    elif outcomes == {True}:
        wanted = s.largest + stride
    elif outcomes == {False}:
        wanted = s.smallest_failing - stride
    else:
        wanted = (s.largest + s.smallest_failing) // 2
    return min(high, max(s.largest + s.step, snap(wanted, s.step)))


def search(trial, planned: int, up_to_factor: int, guess: int, seconds: float, most: int | None = None,
           over: int | None = None) -> Search:
    """trial(batch) -> (fits, peak_bytes, note). planned: a batch known to fit; most: the largest batch the data can
    supply (digits' training split), if any; over: the batch to try after a fitting guess, expected not to fit."""
    step = grid_step(planned)
    up_to = planned * up_to_factor if most is None else max(planned, min(planned * up_to_factor, most))
    s = Search(planned=planned, up_to=snap(up_to, step), step=step, largest=planned)
    spent, per_item = 0.0, 0.0  # seconds of trial steps so far; the slowest fitting try's seconds per item
    while True:
        if s.largest >= s.up_to:
            cap = "the search's cap" if most is None or most >= planned * up_to_factor else "the data has no more"
            s.bound, s.why = "capped", f"fits at {s.up_to}, {s.up_to / planned:.3g}x the planned batch ({cap})"
            return s
        if s.smallest_failing is not None and s.smallest_failing - s.largest <= s.step:
            s.bound, s.why = "exact", f"fits at {s.largest}, not at {s.smallest_failing}"
            return s
        batch = next_batch(s, guess, over)
        if s.tries and spent + per_item * batch > seconds:  # the first try always runs
            s.bound = "at_least"
            s.why = (f"fits at {s.largest}; the search's {seconds:g} s of trial steps were spent before it tried "
                     f"{batch}" + (f" (fails at {s.smallest_failing})" if s.smallest_failing else ""))
            return s
        started = time.perf_counter()
        fits, peak, note = trial(batch)
        took = time.perf_counter() - started
        spent += took
        s.tries.append({"batch": batch, "fits": fits, "peak_allocated_bytes": peak, "seconds": round(took, 3),
                        "note": note})
        if fits:
            per_item = max(per_item, took / batch)
            s.largest = batch
        else:
            s.smallest_failing = batch


def _largest_under(settings: ModelSettings | dict, precision: str, optimizer: str, planned: int, scale: float,
                   limit: float, up_to: int) -> int:
    """The largest batch on the planned batch's grid, from it up to up_to, whose scaled estimate is at most limit."""
    from amprepro import memory

    step = grid_step(planned)
    lo, hi = planned, snap(up_to, step)
    while hi > lo:  # the estimate grows with the batch: bisect on the grid
        mid = snap((lo + hi + step) // 2, step)
        if memory.estimate(settings, precision, optimizer, batch=mid).total * scale <= limit:
            lo = mid
        else:
            hi = mid - step
    return lo


def guess_batch(settings: ModelSettings | dict, precision: str, optimizer: str, planned: int, measured_peak: int | None,
                budget: int, up_to: int) -> tuple[int, str]:
    """The largest batch on the grid whose estimate, scaled by this cell's measured/estimated peak at the planned
    batch, stays under GUESS_MARGIN of the budget."""
    scale = _scale(settings, precision, optimizer, planned, measured_peak)
    guess = _largest_under(settings, precision, optimizer, planned, scale, GUESS_MARGIN * budget, up_to)
    return guess, f"the memory model scaled by {scale:.2f} (measured/estimated peak at {planned})"


def over_batch(settings: ModelSettings | dict, precision: str, optimizer: str, planned: int, measured_peak: int | None,
               budget: int, up_to: int) -> int | None:
    """The smallest batch on the grid whose scaled estimate is over OVER_MARGIN of the budget: the try after a fitting
    guess, which the model expects to fail (None where even the search's cap is under it)."""
    scale = _scale(settings, precision, optimizer, planned, measured_peak)
    under = _largest_under(settings, precision, optimizer, planned, scale, OVER_MARGIN * budget, up_to)
    return None if under >= snap(up_to, grid_step(planned)) else under + grid_step(planned)


def _scale(settings: ModelSettings | dict, precision: str, optimizer: str, planned: int,
           measured_peak: int | None) -> float:
    from amprepro import memory

    if not measured_peak:
        return 1.0
    return measured_peak / memory.estimate(settings, precision, optimizer, batch=planned).total


def not_searched(spec: CellSpec, reason: str, **extra) -> dict:
    return {"model": spec.model, "precision": spec.precision, "seed": spec.seed, "status": "skipped",
            "reason": reason, **extra}


def run(spec: CellSpec, cell: dict, plan: dict | None, apex: dict, up_to: int, seconds: float,
        init_cache=None) -> dict:
    if cell.get("status") != "ok":  # before importing torch: seconds per job on a cluster node
        return not_searched(spec, f"its cell did not run at the planned batch ({cell.get('status')}: "
                                  f"{(cell.get('reason') or '')[:160]})")
    import torch

    from amprepro import datakinds, memory
    from amprepro.train import measure, oom, precision
    from amprepro.train.cell import build_cell, make_data, seed_everything
    if not torch.cuda.is_available():
        return not_searched(spec, "the largest batch is a GPU-memory measurement; torch sees no CUDA GPU here")
    spec = spec.planned(plan)
    device = torch.device("cuda")
    seed_everything(spec.seed, False)
    precision.configure_tf32(spec.precision)
    limit = oom.apply_memory_limit(plan, device)
    budget = limit or torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
    settings = spec.settings
    # as the training run builds its cell (amprepro.train.train.train_cell), its weights from the same cache
    built = build_cell(spec, device, plan, init_cache=init_cache)
    trainer = built.trainer

    data_seconds = {}  # per batch tried: the part of its try that made its batch (synthetic data: on the device)

    def trial(batch: int, steps: int = STEPS_PER_TRY) -> tuple[bool, int | None, str]:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        note = ""
        forget_optimizer_state(trainer.optimizer)  # as in a fresh cell, its first step allocates it
        torch.cuda.empty_cache()
        started = time.perf_counter()
        try:
            x, y = make_data(dataclasses.replace(settings, batch_size=batch), spec.seed, device, built.model,
                             on_device=True).next()
            x = built.inputs(x)
            torch.cuda.synchronize(device)
            data_seconds[batch] = round(time.perf_counter() - started, 3)
            for _ in range(steps):
                trainer.step(x, y)
            torch.cuda.synchronize(device)
            fits = True
        except Exception as exc:  # only an allocation failure is an answer; anything else is raised
            if not oom.out_of_memory(exc):
                raise
            fits, note = False, (str(exc).strip().splitlines() or [""])[0][:200]
        peak = torch.cuda.max_memory_allocated(device)
        if fits and not memory.within_headroom(peak, budget):
            fits, note = False, f"its step ran, but its peak is over {memory.HEADROOM:.0%} of the budget"
        x = y = None  # the try's batch goes before the cache is emptied
        trainer.zero_grad()
        if trainer.scaler is not None:  # a step cut short leaves GradScaler mid-step
            trainer.scaler._per_optimizer_states.clear()
        gc.collect()
        torch.cuda.empty_cache()
        return fits, peak, note

    planned = spec.batch_size
    warm_started = time.perf_counter()
    fits, warm_peak, note = trial(planned, steps=1)  # allocates the optimizer state; the cell ran here, so one step
    warm_seconds = time.perf_counter() - warm_started
    base = {"model": spec.model, "precision": spec.precision, "seed": spec.seed, "spec": spec.as_dict(),
            "hardware": measure.hardware(device), "budget_bytes": budget, "allocator_limit_bytes": limit,
            "cap_gib": (plan or {}).get("cap_gib"), "warm_peak_allocated_bytes": warm_peak}
    if not fits:
        return {**base, **not_searched(spec, f"out of memory at the planned batch {planned} in the search's process "
                                             f"({note})")}
    most = datakinds.largest_batch(settings.data)
    known = (settings, spec.precision, spec.optimizer, planned, cell.get("peak_allocated_bytes") or warm_peak,
             budget, planned * up_to if most is None else min(planned * up_to, most))
    guess, how = guess_batch(*known)
    over = over_batch(*known)
    result = search(trial, planned, up_to, guess, seconds, most=most, over=over)
    for t in result.tries:
        t["data_seconds"] = data_seconds.get(t["batch"])
    return {**base, "status": "ok", "guess_batch": guess, "guess_how": how, "over_batch": over,
            "seconds_allowed": seconds,
            "warm_seconds": round(warm_seconds, 3), **result.as_record()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="JSON of the cell's settings (as the train job gets it)")
    parser.add_argument("--cell", required=True, help="the cell's metrics.json at the planned batch")
    parser.add_argument("--plan", help="results/plan/models/<model>.json")
    parser.add_argument("--apex", help="results/apex/runs.json, for an apex precision")
    parser.add_argument("--up-to", type=int, default=8, help="the largest batch tried, times the planned batch")
    parser.add_argument("--seconds", type=float, default=10.0, help="trial-step seconds this search may spend")
    parser.add_argument("--init-cache", help="directory of initial weights that cells share (amprepro.train.initcache)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from amprepro.train import record as records
    from amprepro.train import train

    spec = CellSpec.from_json(args.spec)
    apex = records.cell_apex(args.apex)
    train.put_apex_on_path(apex)
    started = time.monotonic()
    record = run(spec, read_json(args.cell), records.cell_plan(args.plan), apex, args.up_to, args.seconds,
                 args.init_cache)
    record["wall_seconds"] = round(time.monotonic() - started, 2)
    write_json(args.out, record)
    print(f"{spec.model}/{spec.precision}: {record['status']} "
          f"{record.get('why') or record.get('reason', '')}")


if __name__ == "__main__":
    main()
