"""Does a precision change what the model learns? Each precision's final held-out loss against FP32's seed spread.

For a model whose cells record a held-out loss (model_config eval_every; amprepro.train.heldout), per precision:

    delta = mean over seeds of the precision's final held-out loss - mean over seeds of FP32's
    noise = NOISE_SDS x FP32's seed-to-seed standard deviation (sample sd, n - 1 in the denominator)

and the verdict is **within noise** when |delta| <= noise, **better** when delta < -noise (a lower held-out loss),
**worse** when delta > +noise; a precision with a collapsed seed (non-finite loss) is **worse**. FP32's band shown
next to it is mean ± noise, and FP32's min–max is given too.

Why 2 sd of single runs, with 3 seeds: the difference of two means of n seeds each has a standard error of about
sd·sqrt(2/n) (0.82 sd at n = 3), so 2 sd is about 2.4 standard errors: a difference outside it is unlikely to be seed
noise alone. With 3 seeds the sd is itself uncertain (its 95 % interval spans roughly 0.5x to 6x), so a verdict near
the band's edge is marked as such; more seeds narrow it. FP32 needs at least MIN_SEEDS seeds to have a spread at all.

The accuracy claim (config/claims.yaml, `convergence:`) takes its verdict from here where these cells exist
(judge_claim).
"""

from __future__ import annotations

import math
import statistics

BASELINE = "fp32"
NOISE_SDS = 2.0
MIN_SEEDS = 2
RECOMMENDED_SEEDS = 3
EDGE = 0.25  # |delta| within 25 % of the noise band's edge: "near the edge"
BAND_TEXT = f"FP32 mean ± {NOISE_SDS:g}·sd over its seeds (sample sd)"
VERDICTS = ("within noise", "better", "worse")
# The claim verdict (claims.VERDICT_TEXT) for an `at_least: 0` accuracy claim ("not lower than FP32"): a difference
# inside FP32's noise is consistent with it; only a held-out loss worse beyond the noise contradicts it.
CLAIM_VERDICT = {"better": "holds", "within noise": "holds", "worse": "falls_short"}


def fmt_loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def spread(values: list[float]) -> dict:
    """mean, sample sd (None for one value), min, max and n of some seeds' values."""
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values), "n": len(values)}


def compare(baseline: list[float], variant: list[float], collapsed: int = 0, k: float = NOISE_SDS) -> dict:
    """The verdict of one precision's final held-out losses (per seed) against FP32's, with every number behind it.
    verdict None (with reason) when there is nothing to judge."""
    out = {"verdict": None, "reason": "", "collapsed_seeds": collapsed, "band_rule": BAND_TEXT}
    if len(baseline) < MIN_SEEDS:
        out["reason"] = (f"FP32 has {len(baseline)} seed(s) with a held-out loss: a seed-to-seed spread needs at "
                         f"least {MIN_SEEDS} ({RECOMMENDED_SEEDS} recommended)")
        return out
    base = spread(baseline)
    noise = k * base["sd"]
    out.update(baseline=base, noise=noise, band=[base["mean"] - noise, base["mean"] + noise])
    if collapsed:
        out.update(verdict="worse", reason=f"collapsed (non-finite loss) in {collapsed} seed(s)")
        if variant:
            out["variant"] = spread(variant)
        return out
    if not variant:
        out["reason"] = "no seed with a held-out loss"
        return out
    var = spread(variant)
    delta = var["mean"] - base["mean"]
    verdict = "within noise" if abs(delta) <= noise else ("better" if delta < 0 else "worse")
    near_edge = noise > 0 and abs(abs(delta) - noise) <= EDGE * noise
    out.update(variant=var, delta=delta, verdict=verdict, near_edge=near_edge,
               reason=(f"final held-out loss {fmt_loss(var['mean'])}"
                       + (f" ± {fmt_loss(var['sd'])}" if var["sd"] is not None else "")
                       + f" ({var['n']} seeds) vs FP32 {fmt_loss(base['mean'])} ± {fmt_loss(base['sd'])} "
                       f"({base['n']} seeds): Δ {delta:+.4f}, noise band ±{noise:.4f} ({NOISE_SDS:g}·sd)"
                       + (" — near the band's edge" if near_edge else "")))
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


def model_verdicts(summary: dict, model: str) -> dict:
    """Every precision of one model against FP32: {"model", "baseline": spread, "precisions": {p: compare(...)}}."""
    losses = final_losses(summary, model)
    fp32 = list(losses.get(BASELINE, {}).get("values", {}).values())
    result = {"model": model, "baseline": spread(fp32) if fp32 else None, "band_rule": BAND_TEXT, "precisions": {}}
    for precision, entry in losses.items():
        if precision == BASELINE:
            continue
        if not entry["values"] and not entry["collapsed"]:
            statuses = sorted({f"{status}: {why}" if why else status for _, status, why in entry["other"]})
            result["precisions"][precision] = {"verdict": None, "reason": "; ".join(statuses) or "no cell"}
            continue
        result["precisions"][precision] = compare(fp32, list(entry["values"].values()), len(entry["collapsed"]))
    return result


def measured_on(summary: dict, model: str, data_records: dict | None = None) -> str:
    """What the held-out loss was measured on, from a cell's data record (metrics.json data_record) where given."""
    record = (data_records or {}).get(model)
    if record and record.get("kind") == "python_stdlib":
        return (f"byte-level held-out loss of a GPT on the Python {record.get('python')} standard library's source "
                f"({record.get('files')} files, {record.get('heldout_files')} held out by file; corpus sha256 "
                f"{str(record.get('corpus_sha256'))[:12]}…), not ImageNet")
    return f"held-out loss of {model} (not ImageNet)"


def judge_claim(claim: dict, summary: dict, data_records: dict | None = None) -> dict | None:
    """The verdict of an accuracy claim from the convergence cells its `convergence.models` names, or None where none
    of them ran. Returns {"verdict", "verdict_text", "reason", "measured_text", "by_baseline", "measured_on"}."""
    wanted = claim["convergence"]["models"]
    models = [m for m in convergence_models(summary) if m in wanted]
    if not models:
        return None
    variant, per_model = claim["variant"], {}
    for model in models:
        judged = model_verdicts(summary, model)["precisions"].get(variant)
        on = measured_on(summary, model, data_records)
        if judged is None or judged["verdict"] is None:
            why = judged["reason"] if judged else f"no {variant} cell"
            per_model[model] = {"verdict": "not_measurable", "reason": f"{model}/{variant}: {why}",
                                "measured_text": "", "measured_on": on}
            continue
        per_model[model] = {"verdict": CLAIM_VERDICT[judged["verdict"]], "convergence": judged["verdict"],
                            "reason": f"{model}/{variant}: {judged['verdict']}: {judged['reason']}",
                            "measured_text": f"{judged['verdict']} ({judged['reason']}) [{on}]",
                            "borderline": bool(judged.get("near_edge")), "measured_on": on, "numbers": judged}
    measured = [r for r in per_model.values() if r["verdict"] != "not_measurable"]
    reason = "; ".join(r["reason"] for r in per_model.values())
    if not measured:
        return {"verdict": "not_measurable", "verdict_text": "not measurable here",
                "reason": f"held-out loss cells: {reason}", "measured_text": "", "by_baseline": {}}
    worst = "falls_short" if any(r["verdict"] == "falls_short" for r in measured) else "holds"
    kinds = sorted({r["convergence"] for r in measured})
    text = {"holds": "holds", "falls_short": "falls short"}[worst]
    if worst == "holds":
        text += (" (within FP32's seed noise: not lower; 'slightly higher' not shown)" if kinds == ["within noise"]
                 else " (lower held-out loss than FP32 beyond its seed noise)" if kinds == ["better"]
                 else " (better or within FP32's seed noise)")
    else:
        text += " (higher held-out loss than FP32 beyond its seed noise)"
    return {"verdict": worst, "verdict_text": text, "reason": reason,
            "measured_text": "; ".join(r["measured_text"] for r in measured),
            "by_baseline": {BASELINE: {"verdict": worst, "reason": reason, "models": per_model}}}


def report_lines(summary: dict) -> list[str]:
    """Each convergence model's precisions, one line each: final held-out loss mean ± sd over seeds and the verdict."""
    lines = []
    for model in convergence_models(summary):
        judged, losses = model_verdicts(summary, model), final_losses(summary, model)
        lines.append(f"{model}: final held-out loss per precision (mean ± sample sd over seeds); band: {BAND_TEXT}")
        for precision, entry in losses.items():
            values = list(entry["values"].values())
            stats = spread(values) if values else None
            text = (f"{fmt_loss(stats['mean'])} ± {fmt_loss(stats['sd'])} (min–max {fmt_loss(stats['min'])}–"
                    f"{fmt_loss(stats['max'])}, {stats['n']} seeds)" if stats else "no value")
            if entry["collapsed"]:
                text += f", {len(entry['collapsed'])} seed(s) collapsed"
            verdict = "baseline" if precision == BASELINE else judged["precisions"][precision]
            if isinstance(verdict, dict):
                verdict = (f"{verdict['verdict']}: Δ {verdict['delta']:+.4f} vs noise ±{verdict['noise']:.4f}"
                           if verdict.get("delta") is not None
                           else f"{verdict['verdict'] or 'not judged'}: {verdict['reason']}")
            lines.append(f"  {precision}: {text}; {verdict}")
    return lines or ["no cell recorded a held-out loss"]


def main(argv=None) -> None:
    from amprepro.report import print_summary_lines

    print_summary_lines(argv, __doc__.split("\n")[0], report_lines)


if __name__ == "__main__":
    main()
