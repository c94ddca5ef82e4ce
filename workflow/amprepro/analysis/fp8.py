"""Each cell against its precision's own baseline (precisions.Precision.baseline: FP8 against compiled bf16, compiled
bf16 against eager bf16), same model and seed: speedup, memory and the per-step loss gap; and the words of the
report's FP8 section, which say where FP8 pays and where it does not (its HTML: amprepro.report.fp8section).

The loss gap compares the two cells' steps.csv step by step (same seed: same initial weights and the same batches):
relative gap |loss - baseline loss| / |baseline loss| at every step where both are finite; the final gap is signed
(positive: the cell's loss is higher) at the last step both ran, relative and in the loss's own unit (nats). A
synthetic cell trains on one fixed batch, which a large model memorises within its few steps (on the H200 the 7B
shape's bf16 loss fell from 11.17 to 0.003 nats in 10 steps): a relative gap at the end then compares two near-zero
losses and says little. Where the baseline's last loss is below MEMORISED of its first, the verdict says so and gives
the absolute gap and the gap over the steps before the loss fell that low. Either way the gap measures the numerical
agreement of the steps, not convergence.

Over seeds (seed_gaps): one seed's final gap on real text is mostly where that run's noise left it (two runs of one
precision with a small batch end a few percent apart), so where a model's pairs ran with two seeds or more, the section
also gives the mean of the paired final gaps (held-out and training loss), their sample sd, the two-sided 95 %
Student-t interval of the mean and the one-sided 95 % upper bound, and judges it against GAP_LIMIT: under when the
upper bound is below it (the cell's final loss is, at 95 %, not more than GAP_LIMIT above its baseline's), over when
the one-sided lower bound is above it, otherwise not settled by that many seeds. The statistics are
amprepro.analysis.paired's, which the accuracy claim uses too.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from amprepro import precisions
from amprepro.analysis import paired
from amprepro.analysis.paired import T_ONE_SIDED_95, T_TWO_SIDED_95, t_quantile  # noqa: F401 (the FP8 tests' names)
from amprepro.cellid import CellId

COLUMNS = ["baseline_precision", "speedup_vs_baseline", "memory_ratio_vs_baseline", "loss_gap_final_vs_baseline",
           "loss_gap_final_abs_vs_baseline", "baseline_loss_first", "baseline_loss_final", "loss_gap_max_vs_baseline",
           "loss_gap_max_unmemorised_vs_baseline", "loss_gap_steps", "heldout_gap_final_vs_baseline",
           "baseline_heldout_loss_final", "nonfinite_steps", "fp8_weight_fraction"]
PAYS = 1.0  # speedup over compiled bf16 above which FP8 "pays" in the section's verdict
MEMORISED = 0.01  # the baseline's last loss below this share of its first: the fixed batch was memorised
GAP_LIMIT = 0.01  # issue 26's acceptance: the final loss within 1 % of the baseline's (seed_gaps' verdict)
SEED_GAPS = (("heldout_gap_final_vs_baseline", "final held-out loss"),
             ("loss_gap_final_vs_baseline", "final training loss"))


def _ratio(a, b):
    return a / b if a and b else None


def step_losses(steps_csv: Path) -> dict[int, float] | None:
    if not steps_csv.is_file():
        return None
    with steps_csv.open(newline="") as handle:
        return {int(row["step"]): float(row["loss"]) for row in csv.DictReader(handle)}


def loss_gaps(cell: dict[int, float] | None, baseline: dict[int, float] | None) -> dict:
    """The final (signed) and largest relative per-step loss gap of a cell against its baseline, over the steps
    both ran with a finite loss; None where there is nothing to compare."""
    none = {"loss_gap_final_vs_baseline": None, "loss_gap_final_abs_vs_baseline": None, "baseline_loss_first": None,
            "baseline_loss_final": None, "loss_gap_max_vs_baseline": None,
            "loss_gap_max_unmemorised_vs_baseline": None, "loss_gap_steps": 0}
    if not cell or not baseline:
        return none
    common = sorted(step for step in set(cell) & set(baseline)
                    if math.isfinite(cell[step]) and math.isfinite(baseline[step]) and baseline[step] != 0)
    if not common:
        return none
    gaps = {s: abs(cell[s] - baseline[s]) / abs(baseline[s]) for s in common}
    first = baseline[common[0]]
    unmemorised = [gaps[s] for s in common if abs(baseline[s]) >= MEMORISED * abs(first)]
    last = max(set(cell) & set(baseline))
    ends = last == common[-1]  # the last common step was not finite in one of them: no final gap
    return {"loss_gap_final_vs_baseline": (cell[last] - baseline[last]) / abs(baseline[last]) if ends else None,
            "loss_gap_final_abs_vs_baseline": cell[last] - baseline[last] if ends else None,
            "baseline_loss_first": first, "baseline_loss_final": baseline[last] if ends else None,
            "loss_gap_max_vs_baseline": max(gaps.values()),
            "loss_gap_max_unmemorised_vs_baseline": max(unmemorised),  # never empty: the first step counts
            "loss_gap_steps": len(common)}


def memorised(row: dict) -> bool:
    """Whether the baseline's loss fell below MEMORISED of its first: the cell memorised its fixed batch."""
    first, final = row.get("baseline_loss_first"), row.get("baseline_loss_final")
    return first is not None and final is not None and abs(final) < MEMORISED * abs(first)


def gap_text(row: dict, base: str) -> str:
    """The verdict's words for the final-loss gap (empty where there is none)."""
    gap = row.get("loss_gap_final_vs_baseline")
    if gap is None:
        return ""
    if not memorised(row):
        return f", final loss {_pct(gap, signed=True)} against {base}"
    before = row.get("loss_gap_max_unmemorised_vs_baseline")
    before_text = f"; largest step gap before that {_pct(before)}" if before is not None else ""
    return (f", final loss {row['loss_gap_final_abs_vs_baseline']:+.4f} nats against {base}'s "
            f"{row['baseline_loss_final']:.4f} ({_pct(gap, signed=True)}: {base}'s loss fell from "
            f"{row['baseline_loss_first']:.2f} to below {MEMORISED:.0%} of it, the fixed synthetic batch memorised, so "
            f"the relative gap compares two near-zero losses{before_text})")


def heldout_text(row: dict) -> str:
    """The verdict's words for the held-out loss gap (empty where either cell has no held-out loss)."""
    gap = row.get("heldout_gap_final_vs_baseline")
    if gap is None:
        return ""
    return (f", held-out loss {_pct(gap, signed=True)} ({row['heldout_loss_final']:.4f} against "
            f"{row['baseline_heldout_loss_final']:.4f} nats)")


def floor_text(row: dict, rows: list[dict], base: str) -> str:
    """The same gaps between the baseline and its own baseline (compiled against eager bf16: one precision, two
    kernels' rounding): how far apart two runs that should agree drift over the same steps."""
    spec = precisions.get(row["precision"])
    found = next((r for r in rows if CellId.of(r) == CellId.of(row).at(spec.baseline)), None)
    if not found or found.get("loss_gap_final_vs_baseline") is None:
        return ""
    own = precisions.label(found["baseline_precision"])
    if memorised(found):  # the relative gaps after the loss fell near zero say little (gap_text)
        return (f"; {base} against {own} over the same steps: largest step gap before the batch was memorised "
                f"{_pct(found.get('loss_gap_max_unmemorised_vs_baseline'))}, final "
                f"{found['loss_gap_final_abs_vs_baseline']:+.4f} nats")
    held = found.get("heldout_gap_final_vs_baseline")
    held_text = f", held-out {_pct(held, signed=True)}" if held is not None else ""
    return (f"; {base} against {own} over the same steps: final loss "
            f"{_pct(found['loss_gap_final_vs_baseline'], signed=True)}{held_text}, largest step gap "
            f"{_pct(found.get('loss_gap_max_vs_baseline'))}")


def add_baseline(rows: list[dict], metrics: list[dict], metric_files: list[str]) -> list[dict]:
    """Fill COLUMNS for every row (None where the precision has no baseline or the baseline did not run)."""
    ok = {CellId.of(r): (r, Path(path).with_name("steps.csv"))
          for r, path in zip(rows, metric_files) if r["status"] == "ok"}
    for row, m, path in zip(rows, metrics, metric_files):
        base_name = precisions.get(row["precision"]).baseline if row["precision"] in precisions.REGISTRY else None
        row.update({column: None for column in COLUMNS})
        row["baseline_precision"] = base_name
        row["nonfinite_steps"] = m.get("nonfinite_steps")
        row["fp8_weight_fraction"] = (m.get("float8") or {}).get("fp8_weight_fraction")
        row["loss_gap_steps"] = 0
        found = ok.get(CellId.of(row).at(base_name)) if base_name else None
        if base_name is None or found is None or row["status"] not in ("ok", "collapsed"):
            continue
        base, base_steps = found
        row["speedup_vs_baseline"] = _ratio(row.get("throughput_per_s"), base.get("throughput_per_s"))
        row["memory_ratio_vs_baseline"] = _ratio(row.get("peak_allocated_bytes"), base.get("peak_allocated_bytes"))
        row.update(loss_gaps(step_losses(Path(path).with_name("steps.csv")), step_losses(base_steps)))
        held, base_held = row.get("heldout_loss_final"), base.get("heldout_loss_final")
        if held is not None and base_held:  # both record a held-out loss (model_config eval_every)
            row["baseline_heldout_loss_final"] = base_held
            row["heldout_gap_final_vs_baseline"] = (held - base_held) / abs(base_held)
    return rows


def seed_interval(values: list[float]) -> dict | None:
    """The mean of some seeds' paired gaps with its sample sd, two-sided 95 % interval (low, high), one-sided 95 %
    bounds (lower, upper) and the verdict against GAP_LIMIT (amprepro.analysis.paired.interval); None for fewer than
    two."""
    return paired.interval(values, GAP_LIMIT)


def seed_gaps(rows: list[dict]) -> list[dict]:
    """Per model and precision with a baseline, over its seeds whose pair ran (status ok, the batch not memorised):
    each SEED_GAPS gap's seed_interval, and the seeds left out because the cell collapsed. Only groups with an
    interval."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("baseline_precision") and r.get("speedup_vs_baseline") is not None and not memorised(r):
            groups.setdefault((r["model"], r["precision"]), []).append(r)
    out = []
    for (model, precision), members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        entry = {"model": model, "precision": precision, "baseline": members[0]["baseline_precision"],
                 "collapsed_seeds": sorted(r["seed"] for r in members if r["status"] != "ok"),
                 **{key: seed_interval([r[key] for r in ok if r.get(key) is not None]) for key, _ in SEED_GAPS}}
        if any(entry[key] for key, _ in SEED_GAPS):
            out.append(entry)
    return out


LIMIT_TEXT = f"{GAP_LIMIT * 100:g} %"
VERDICT_WORDS = {"under": f"under {LIMIT_TEXT}", "over": f"over {LIMIT_TEXT}",
                 "not settled": f"not settled against {LIMIT_TEXT}"}


def seed_gap_text(entry: dict) -> str:
    """One sentence for a seed_gaps entry."""
    parts = []
    for key, what in SEED_GAPS:
        s = entry[key]
        if s:
            parts.append(f"{what} {paired.interval_text(s)}: {VERDICT_WORDS[s['verdict']]}")
    collapsed = entry["collapsed_seeds"]
    left = f"; seeds {', '.join(map(str, collapsed))} collapsed (non-finite loss) and are left out" if collapsed else ""
    return (f"{entry['model']} {precisions.label(entry['precision'])} against {precisions.label(entry['baseline'])}, "
            f"the mean of the paired gaps: {'; '.join(parts)}{left}")


# --- the section's words (its HTML: amprepro.report.fp8section) ---

SEEDS_INTRO = (f"Over seeds: one run's final gap on real text is mostly where its noise left it, so each pair's gap "
               f"(same seed: same initial weights and batches) is averaged over the seeds, with Student's t interval "
               f"and a verdict against {LIMIT_TEXT}: under when the one-sided 95 % upper bound is below it.")


_pct = paired.pct


def fp8_rows(summary: dict) -> list[dict]:
    """The cells of FP8 precisions and of their baselines, by model, in the registry's order."""
    fp8 = {p.name for p in precisions.REGISTRY.values() if p.needs_torchao}
    wanted = fp8 | {precisions.get(name).baseline for name in fp8}
    order = {name: i for i, name in enumerate(precisions.names())}
    cells = [c for c in summary.get("cells", []) if c["precision"] in wanted]
    models_with_fp8 = {c["model"] for c in cells if c["precision"] in fp8}
    cells = [c for c in cells if c["model"] in models_with_fp8]
    return sorted(cells, key=lambda c: (c["model"], order[c["precision"]], c["seed"]))


def verdicts(rows: list[dict]) -> list[str]:
    """One plain sentence per FP8 cell: it pays, it does not, or why it was not measured."""
    said = []
    for c in rows:
        spec = precisions.get(c["precision"])
        if not spec.needs_torchao:
            continue
        what = f"{c['model']} {spec.label} (seed {c['seed']})"
        if c["status"] not in ("ok", "collapsed"):
            said.append(f"{what}: not measured, {c['status']}: {c.get('reason') or ''}")
            continue
        speedup, base = c.get("speedup_vs_baseline"), precisions.label(spec.baseline)
        if speedup is None:
            said.append(f"{what}: no {base} cell of the same model and seed ran, so no speedup")
            continue
        memory = c.get("memory_ratio_vs_baseline")
        memory_text = f", peak memory {memory:.2f}x" if memory else ""
        gaps = gap_text(c, base) + heldout_text(c) + floor_text(c, rows, base)
        nonfinite = f", {c['nonfinite_steps']} non-finite steps" if c.get("nonfinite_steps") else ""
        if c["status"] == "collapsed":
            said.append(f"{what}: does not pay, the loss went non-finite{nonfinite}")
        elif speedup > PAYS:
            said.append(f"{what}: pays, {speedup:.3f}x {base}{memory_text}{gaps}{nonfinite}")
        else:
            said.append(f"{what}: does not pay, {speedup:.3f}x {base} ({(1 - speedup) * 100:.1f} % slower)"
                        f"{memory_text}{gaps}{nonfinite}")
    return said


def report_lines(summary: dict) -> list[str]:
    """The section's sentences as text: each FP8 cell's verdict, then the gaps over seeds."""
    rows = fp8_rows(summary)
    over_seeds = [seed_gap_text(entry) for entry in seed_gaps(rows)]
    return [*verdicts(rows), *([SEEDS_INTRO, *over_seeds] if over_seeds else [])]


def main(argv=None) -> None:
    from amprepro.analysis import print_summary_lines

    print_summary_lines(argv, "The report's FP8 section as text (amprepro.analysis.fp8).", report_lines)


if __name__ == "__main__":
    main()
