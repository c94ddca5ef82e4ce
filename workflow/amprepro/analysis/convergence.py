"""Does a precision change what the model learns? Each precision's final held-out loss against FP32's, paired by seed.

For a model whose cells record a held-out loss (model_config eval_every; amprepro.train.heldout), per precision and
seed where both it and FP32 ran: the relative gap (loss - FP32's loss) / FP32's loss. Every precision of a seed
starts from the same initial weights and draws the same batches (amprepro.train.train; tests/accuracy checks it), so
the seed's noise is shared and the gap is the precision's effect plus run-to-run rounding. Over the seeds, the mean
gap with its Student-t 95 % interval and one-sided 95 % bounds (amprepro.analysis.paired), and two one-sided questions:

- against the margin (MARGIN, 1 % relative; the claims state theirs in config/claims.yaml): **under** (the loss is at
  95 % not more than the margin above FP32's), **over** (more than the margin above it) or **not settled** by that
  many seeds; a precision with a collapsed seed (non-finite loss, loss scale below 1) is **collapsed**;
- against zero (the article's "slightly higher" accuracy): **lower** (the upper bound is below 0), **higher** (the
  lower bound is above 0) or **includes 0** (no difference shown).

Why paired: the old verdict compared the means against 2 x FP32's seed sd (3 seeds: ±0.68 nats, one seed far from
the others), so almost any result held. Pairing removes the shared seed noise, and 8 seeds (the accuracy preset) put
the one-sided t at 1.895 instead of 2.920.

The accuracy claim (config/claims.yaml, `convergence:`) takes its verdict from here where these cells exist
(judge_claim).
"""

from __future__ import annotations

import math
import statistics

from amprepro import precisions
from amprepro.analysis import paired

BASELINE = "fp32"
MARGIN = 0.01  # relative: the section's margin, and the one config/claims.yaml states for its claims (a test checks)
MIN_SEEDS = 2
RULE_TEXT = ("final held-out loss gap against FP32, paired by seed (same initial weights and batches): mean with its "
             "Student-t 95 % interval and one-sided 95 % bounds")
VERDICTS = ("under", "over", "not settled", "collapsed")
# The claim verdict (claims.VERDICT_TEXT) of an accuracy claim, "not lower than FP32" within the margin.
CLAIM_VERDICT = {"under": "holds", "over": "falls_short", "collapsed": "falls_short", "not settled": "not_settled"}
# The article's "slightly higher", its own one-sided question: a lower held-out loss shown, or not.
SLIGHTLY_HIGHER = {"lower": "holds", "includes 0": "not shown", "higher": "falls short"}


def fmt_loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def verdict_words(verdict: str, margin: float) -> str:
    m = f"{margin * 100:g} %"
    return {"under": f"not worse than FP32 by {m} (upper bound below the margin)",
            "over": f"worse than FP32 by more than {m} (lower bound above the margin)",
            "not settled": f"not settled against {m}", "collapsed": "collapsed"}[verdict]


def spread(values: list[float]) -> dict:
    """mean, sample sd (None for one value), min, max and n of some seeds' values."""
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values), "n": len(values)}


def compare(baseline: dict, variant: dict, collapsed: list | tuple = (), margin: float = MARGIN) -> dict:
    """One precision's final held-out losses ({seed: loss}) against FP32's, paired by seed: the gaps, their
    paired.interval and the verdicts (module docstring), with the numbers in `reason`. verdict None (with reason)
    where there is nothing to judge."""
    gaps = paired.paired_gaps(variant, baseline)
    out = {"verdict": None, "zero": None, "reason": "", "collapsed_seeds": sorted(collapsed), "margin": margin,
           "gaps": gaps, "band_rule": RULE_TEXT}
    stats = paired.interval(list(gaps.values()), margin)
    if stats:
        out.update(stats=stats, zero=stats["zero"], baseline=spread([baseline[s] for s in gaps]),
                   variant=spread([variant[s] for s in gaps]))
    if collapsed:
        seeds = ", ".join(map(str, sorted(collapsed)))
        out.update(verdict="collapsed", reason=f"collapsed (non-finite loss or loss scale below 1) in seed(s) {seeds}"
                   + (f"; the other seeds' gap {paired.interval_text(stats)}" if stats else ""))
        return out
    if stats is None:
        out["reason"] = (f"{len(gaps)} seed(s) where both this precision and FP32 have a final held-out loss: a "
                         f"paired interval needs at least {MIN_SEEDS}")
        return out
    out["verdict"] = stats["verdict"]
    unpaired = sorted(set(variant) - set(gaps))
    left_out = (f"; seed(s) {', '.join(map(str, unpaired))} left out: no finite FP32 loss of the same seed"
                if unpaired else "")
    out["reason"] = (f"final held-out loss {fmt_loss(out['variant']['mean'])} against FP32's "
                     f"{fmt_loss(out['baseline']['mean'])} (means over the {stats['n']} paired seeds); paired gap "
                     f"{paired.interval_text(stats, both=True)}: {verdict_words(stats['verdict'], margin)}; lower "
                     f"than FP32: {paired.ZERO_WORDS[stats['zero']]}{left_out}")
    return out


def convergence_models(summary: dict) -> list[str]:
    """Models with at least one cell that recorded a final held-out loss."""
    return list(dict.fromkeys(c["model"] for c in summary.get("cells", []) if c.get("heldout_loss_final") is not None
                              or (c.get("status") == "collapsed" and "heldout_loss_final" in c)))


def final_losses(summary: dict, model: str) -> dict:
    """precision -> {"values": {seed: final held-out loss}, "collapsed": [seeds], "other": [(seed, status)]}."""
    out: dict = {}
    for cell in summary.get("cells", []):
        if cell["model"] != model:
            continue
        entry = out.setdefault(cell["precision"], {"values": {}, "collapsed": [], "other": []})
        value = cell.get("heldout_loss_final")
        if cell["status"] == "collapsed":
            entry["collapsed"].append(int(cell["seed"]))
        elif cell["status"] == "ok" and value is not None and math.isfinite(value):
            entry["values"][int(cell["seed"])] = float(value)
        else:
            entry["other"].append((int(cell["seed"]), cell["status"], cell.get("reason") or ""))
    return out


def model_verdicts(summary: dict, model: str, margin: float = MARGIN) -> dict:
    """Every precision of one model against FP32: {"model", "baseline": spread, "precisions": {p: compare(...)}}."""
    losses = final_losses(summary, model)
    fp32 = losses.get(BASELINE, {}).get("values", {})
    result = {"model": model, "baseline": spread(list(fp32.values())) if fp32 else None, "band_rule": RULE_TEXT,
              "margin": margin, "precisions": {}}
    for precision, entry in losses.items():
        if precision == BASELINE:
            continue
        if not entry["values"] and not entry["collapsed"]:
            statuses = sorted({f"{status}: {why}" if why else status for _, status, why in entry["other"]})
            result["precisions"][precision] = {"verdict": None, "reason": "; ".join(statuses) or "no cell"}
            continue
        result["precisions"][precision] = compare(fp32, entry["values"], entry["collapsed"], margin)
    return result


def measured_on(summary: dict, model: str, data_records: dict | None = None) -> str:
    """What the held-out loss was measured on, from a cell's data record (metrics.json data_record) where given."""
    record = (data_records or {}).get(model)
    if record and record.get("kind") == "python_stdlib":
        return (f"byte-level held-out loss of a GPT on the Python {record.get('python')} standard library's source "
                f"({record.get('files')} files, {record.get('heldout_files')} held out by file; corpus sha256 "
                f"{str(record.get('corpus_sha256'))[:12]}…), not ImageNet")
    return f"held-out loss of {model} (not ImageNet)"


def slightly_higher(judged: dict) -> dict:
    """The article's "slightly higher" as its own one-sided question: holds / not shown / falls short, and why."""
    stats = judged.get("stats")
    if judged["verdict"] == "collapsed":
        return {"verdict": "falls short", "text": "'slightly higher': falls short (a seed collapsed)"}
    verdict = SLIGHTLY_HIGHER[stats["zero"]]
    why = {"holds": f"the held-out loss is lower than FP32's, upper bound {paired.pct(stats['upper'], True)} < 0",
           "not shown": (f"the 95 % interval {paired.pct(stats['low'], True)} to {paired.pct(stats['high'], True)} "
                         "includes 0"),
           "falls short": (f"the held-out loss is higher than FP32's, lower bound "
                           f"{paired.pct(stats['lower'], True)} > 0")}[verdict]
    return {"verdict": verdict, "text": f"'slightly higher': {verdict} ({why})"}


def numbers_text(model: str, judged: dict) -> str:
    """The verdict's numbers for one model: 'stdlib_gpt: gap +0.16 % over 8 seeds (..., one-sided 95 % bounds ...)'
    or its collapse."""
    if judged["verdict"] == "collapsed":
        return f"{model}: {judged['reason']}"
    return f"{model}: gap {paired.interval_text(judged['stats'], both=True)}"


def judge_claim(claim: dict, summary: dict, data_records: dict | None = None) -> dict | None:
    """The verdict of an accuracy claim from the convergence cells its `convergence.models` names, against its
    `convergence.margin`, or None where none of them ran. Returns {"verdict", "verdict_text", "reason",
    "measured_text", "by_baseline", "slightly_higher"}: verdict holds / falls short on the margin question (not
    settled: not measurable, with the numbers), "slightly higher" its own one-sided verdict in the text."""
    wanted, margin = claim["convergence"]["models"], claim["convergence"]["margin"]
    models = [m for m in convergence_models(summary) if m in wanted]
    if not models:
        return None
    variant, per_model = claim["variant"], {}
    for model in models:
        judged = model_verdicts(summary, model, margin)["precisions"].get(variant)
        on = measured_on(summary, model, data_records)
        if judged is None or judged["verdict"] is None:
            why = judged["reason"] if judged else f"no {variant} cell"
            per_model[model] = {"verdict": "not_measurable", "reason": f"{model}/{variant}: {why}",
                                "measured_text": "", "measured_on": on}
            continue
        higher = slightly_higher(judged)
        verdict = CLAIM_VERDICT[judged["verdict"]]
        settled = "" if verdict != "not_settled" else f"not settled by {judged['stats']['n']} seeds: "
        per_model[model] = {"verdict": verdict, "convergence": judged["verdict"], "slightly_higher": higher,
                            "reason": f"{model}/{variant}: {settled}{judged['reason']}",
                            "measured_text": f"{judged['reason']}; {higher['text']} [{on}]",
                            "measured_on": on, "numbers": judged}
    measured = [r for r in per_model.values() if r["verdict"] not in ("not_measurable", "not_settled")]
    reason = "; ".join(r["reason"] for r in per_model.values())
    if not measured:
        if any(r["verdict"] == "not_settled" for r in per_model.values()):
            return {"verdict": "not_settled", "verdict_text": "not settled by these seeds",
                    "reason": f"held-out loss cells: {reason}", "measured_text": f"held-out loss cells: {reason}",
                    "by_baseline": {}}
        return {"verdict": "not_measurable", "verdict_text": "not measurable here",
                "reason": f"held-out loss cells: {reason}", "measured_text": "", "by_baseline": {}}
    worst = "falls_short" if any(r["verdict"] == "falls_short" for r in measured) else "holds"
    label, m = precisions.label(variant), f"{margin * 100:g} %"
    text = (f"holds: {label}'s final held-out loss is not worse than FP32's by {m}" if worst == "holds"
            else f"falls short: {label}'s final held-out loss is worse than FP32's by more than {m}, or it collapsed")
    numbers = "; ".join(numbers_text(model, r["numbers"]) for model, r in per_model.items()
                        if r["verdict"] != "not_measurable")
    highers = "; ".join(r["slightly_higher"]["text"] for r in measured)
    return {"verdict": worst, "verdict_text": f"{text} ({numbers}); {highers}", "reason": reason,
            "measured_text": "; ".join(r["measured_text"] for r in measured),
            "slightly_higher": [r["slightly_higher"]["verdict"] for r in measured],
            "by_baseline": {BASELINE: {"verdict": worst, "reason": reason, "models": per_model}}}


def report_lines(summary: dict) -> list[str]:
    """Each convergence model's precisions, one line each: final held-out loss mean ± sd over seeds, then the paired
    gap against FP32 with its verdicts."""
    lines = []
    for model in convergence_models(summary):
        judged, losses = model_verdicts(summary, model), final_losses(summary, model)
        lines.append(f"{model}: final held-out loss per precision (mean ± sample sd over seeds); {RULE_TEXT}, "
                     f"margin {MARGIN * 100:g} %")
        for precision, entry in losses.items():
            values = list(entry["values"].values())
            stats = spread(values) if values else None
            text = (f"{fmt_loss(stats['mean'])} ± {fmt_loss(stats['sd'])} (min–max {fmt_loss(stats['min'])}–"
                    f"{fmt_loss(stats['max'])}, {stats['n']} seeds)" if stats else "no value")
            if entry["collapsed"]:
                text += f", {len(entry['collapsed'])} seed(s) collapsed"
            verdict = "baseline" if precision == BASELINE else judged["precisions"][precision]
            if isinstance(verdict, dict):
                verdict = f"{verdict['verdict'] or 'not judged'}: {verdict['reason']}"
            lines.append(f"  {precision}: {text}; {verdict}")
    return lines or ["no cell recorded a held-out loss"]


def main(argv=None) -> None:
    from amprepro.analysis import print_summary_lines

    print_summary_lines(argv, __doc__.split("\n")[0], report_lines)


if __name__ == "__main__":
    main()
