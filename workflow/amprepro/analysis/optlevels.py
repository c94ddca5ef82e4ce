"""The first article's opt-level statements judged on real text (issue 38): "O2：更多操作转为FP16，速度快但可能不稳定"
(O2 may be unstable) and "O3：仅用于推理，不适合训练" (O3 is for inference, not training).

From the accuracy preset's cells of a model trained on real text (config/claims.yaml `stability.models`: stdlib_gpt),
the claim's apex level against FP32 over the preset's seeds, by three signs, per seed:

- **collapsed**: the cell's loss ended non-finite or its loss scale fell below 1 (train.py's status "collapsed"; the
  lowest final loss scale over the seeds is given beside it);
- **non-finite steps**: a step's loss was non-finite even if the run recovered (summary first_nonfinite_step);
- **worse beyond the margin**: the paired final held-out loss gap against FP32 (amprepro.analysis.convergence.compare,
  amprepro.analysis.paired) has its one-sided 95 % lower bound above the claim's margin.

The claim **holds** where any sign shows (for O2: it was unstable here; for O3: it did not train as FP32 does), and
**falls short** where none does and the gap's upper bound is below the margin (it trained like FP32, within the
margin, on every seed). Otherwise the seeds do not settle it: not measurable, with the numbers. Skipped steps (a
dynamic loss scaler's overflow skips) are given but are not a sign: every loss-scaled run has a few. O1, the
article's recommended level, is given beside it for context. A verdict that differs between models says so.
"""

from __future__ import annotations

from amprepro import precisions
from amprepro.analysis import convergence
from amprepro.analysis.paired import pct

CONTEXT = "apex_o1"  # the article's recommended level ("O1：推荐默认选项"), shown beside the claim's level


def cells_of(summary: dict, model: str, precision: str) -> list[dict]:
    return sorted((c for c in summary.get("cells", []) if c["model"] == model and c["precision"] == precision),
                  key=lambda c: int(c["seed"]))


def signs(summary: dict, model: str, precision: str, margin: float) -> dict:
    """Per precision of a model: seeds run, collapsed seeds, seeds with a non-finite step, skipped steps in all, and
    the paired gap against FP32 (convergence.compare), or a reason where it did not train."""
    cells = cells_of(summary, model, precision)
    trained = [c for c in cells if c["status"] in ("ok", "collapsed")]
    if not trained:
        why = sorted({f"{c['status']}: {c.get('reason') or 'no reason recorded'}" for c in cells})
        return {"precision": precision, "trained": 0, "reason": "; ".join(why) or f"no {model}/{precision} cell"}
    losses = convergence.final_losses(summary, model)
    fp32 = losses.get(convergence.BASELINE, {}).get("values", {})
    mine = losses.get(precision, {"values": {}, "collapsed": []})
    return {"precision": precision, "trained": len(trained), "seeds": [int(c["seed"]) for c in trained],
            "collapsed": sorted(mine["collapsed"]),
            "nonfinite": [int(c["seed"]) for c in trained if c.get("first_nonfinite_step") is not None],
            "skipped_steps": sum(int(c.get("skipped_steps") or 0) for c in trained),
            "loss_scale_final_min": min((c["loss_scale_final"] for c in trained
                                         if c.get("loss_scale_final") is not None), default=None),
            "gap": convergence.compare(fp32, mine["values"], (), margin)}


def signs_text(s: dict) -> str:
    """'apex O2 over 8 seeds: no collapse, no non-finite step, 37 skipped steps; <the gap's reason>'."""
    label = precisions.label(s["precision"])
    if not s["trained"]:
        return f"{label}: did not train ({s['reason']})"
    collapsed = (f"collapsed in seed(s) {', '.join(map(str, s['collapsed']))}" if s["collapsed"] else "no collapse")
    nonfinite = (f"a non-finite loss in seed(s) {', '.join(map(str, s['nonfinite']))}" if s["nonfinite"]
                 else "no non-finite step")
    gap, scale = s["gap"], s.get("loss_scale_final_min")
    gap_text = gap["reason"] if gap.get("stats") else f"no paired gap: {gap['reason']}"
    scale_text = f", lowest final loss scale {scale:g}" if scale is not None else ""
    return (f"{label} over {s['trained']} seeds: {collapsed}, {nonfinite}, {s['skipped_steps']} skipped steps in all"
            f"{scale_text}; {gap_text}")


def why_text(s: dict, margin: float) -> str:
    """The signs behind a verdict, short: what showed, or that none did and how close the gap came to the margin."""
    stats, m = s["gap"].get("stats"), f"{margin * 100:g} %"
    found = ([f"collapsed in seed(s) {', '.join(map(str, s['collapsed']))}"] if s["collapsed"] else []) + (
        [f"a non-finite loss in seed(s) {', '.join(map(str, s['nonfinite']))}"] if s["nonfinite"] else [])
    if stats and stats["verdict"] == "over":
        found.append(f"final held-out loss {pct(stats['mean'], True)} against FP32's (one-sided 95 % lower bound "
                     f"{pct(stats['lower'], True)} > {m})")
    if found:
        return "; ".join(found)
    return (f"no collapse or non-finite step in {s['trained']} seeds, final held-out loss {pct(stats['mean'], True)} "
            f"against FP32's (one-sided 95 % upper bound {pct(stats['upper'], True)} < {m})")


def model_verdict(claim: dict, summary: dict, model: str) -> dict:
    """One model's verdict for the claim (module docstring), with the numbers and O1's beside them."""
    margin, variant = claim["stability"]["margin"], claim["variant"]
    mine = signs(summary, model, variant, margin)
    if not cells_of(summary, model, convergence.BASELINE):
        return {"verdict": "not_measurable", "reason": f"{model}: no FP32 cell to pair with", "measured_text": ""}
    if not mine["trained"]:
        return {"verdict": "not_measurable", "reason": f"{model}/{variant}: {mine['reason']}", "measured_text": ""}
    text = signs_text(mine)
    if variant != CONTEXT:
        context = signs(summary, model, CONTEXT, margin)
        if context["trained"]:
            text += f" | beside it {signs_text(context)}"
    gap = mine["gap"]
    verdict_of_gap = (gap.get("stats") or {}).get("verdict")
    if mine["collapsed"] or mine["nonfinite"] or verdict_of_gap == "over":
        verdict = "holds"
    elif verdict_of_gap == "under":
        verdict = "falls_short"
    else:
        return {"verdict": "not_settled", "reason": f"{model}: not settled by these seeds: {text}",
                "measured_text": f"{model}: not settled by these seeds: {text}"}
    return {"verdict": verdict, "reason": f"{model}: {text}", "measured_text": text, "signs": mine,
            "why": f"{model}: {why_text(mine, margin)}"}


def claimed_text(claim: dict) -> str:
    """What the claim says in the terms it is judged by (the claims table's "claimed" column)."""
    return (f"{precisions.label(claim['variant'])} unstable or unfit for training: a collapse, a non-finite loss or a "
            f"final held-out loss above FP32's by more than {claim['stability']['margin'] * 100:g} %")


def judge_claim(claim: dict, summary: dict) -> dict:
    """The claim's verdict over its `stability.models` that ran: verdict, verdict_text, reason, measured_text,
    by_baseline (for the report's claims table) and claimed_text."""
    return {**judged(claim, summary), "claimed_text": claimed_text(claim)}


def judged(claim: dict, summary: dict) -> dict:
    from amprepro.analysis.claimmodels import run_context

    wanted = claim["stability"]["models"]
    present = list(dict.fromkeys(c["model"] for c in summary.get("cells", []) if c["model"] in wanted))
    if not present:  # worded as claims' own "no ... cell ran", which the report's glance shortens (claim_needs)
        here = ", ".join(dict.fromkeys(c["model"] for c in summary.get("cells", []))) or "none"
        return {"verdict": "not_measurable", "verdict_text": "not measurable here", "by_baseline": {},
                "reason": (f"no {'/'.join(wanted)} cell ran (--config preset=accuracy): {run_context(summary)} "
                           f"(models here: {here})"), "measured_text": ""}
    per_model = {model: model_verdict(claim, summary, model) for model in present}
    measured = {m: r for m, r in per_model.items() if r["verdict"] not in ("not_measurable", "not_settled")}
    reason = "; ".join(r["reason"] for r in per_model.values())
    if not measured:
        if any(r["verdict"] == "not_settled" for r in per_model.values()):
            return {"verdict": "not_settled", "verdict_text": "not settled by these seeds", "reason": reason,
                    "measured_text": reason, "by_baseline": {}}
        return {"verdict": "not_measurable", "verdict_text": "not measurable here", "reason": reason,
                "measured_text": "", "by_baseline": {}}
    found = {r["verdict"] for r in measured.values()}
    verdict = "holds" if "holds" in found else "falls_short"
    words = claim["stability"]["verdict_words"]
    whys = "; ".join(r["why"] for r in measured.values())
    if len(found) > 1:
        split = "; ".join(f"{words[v]} for {', '.join(m for m, r in measured.items() if r['verdict'] == v)}"
                          for v in ("holds", "falls_short"))
        text = f"holds for some models ({split}): the verdict depends on the model: {whys}"
    else:
        text = f"{'holds' if verdict == 'holds' else 'falls short'} ({words[verdict]}): {whys}"
    return {"verdict": verdict, "verdict_text": text, "reason": reason,
            "measured_text": "; ".join(r["measured_text"] for r in measured.values()),
            "by_baseline": {convergence.BASELINE: {"verdict": verdict, "reason": reason, "models": per_model}}}
