"""Where AMP goes wrong (the second article's risk points) and whether its remedies rescue it: the verdicts of the
claims with a `risk:` block (config/claims.yaml), from the risk preset's cells (config/presets/risk.yaml).

    "并非所有模型都能安全启用AMP。典型风险点包括：RNN类模型（梯度随时间步累积易溢出）；使用极高温度的Gumbel-Softmax采样；
     自定义归一化层中含有极小分母" and the remedies "对特定层禁用autocast" / "GradScaler(init_scale=2.**14)"

No torch: this reads the summary's cells (amprepro.analysis.summary). Each precision of a model is judged against the
same model's FP32 cells, seed by seed (a seed gives every precision of a model the same initial weights and batches),
and put in one of three classes:

- **harmed**: a seed collapsed (status collapsed: a non-finite final loss, or the loss scale fell below 1), or the
  final held-out loss is worse than FP32's by more than the margin at 95 %: the one-sided 95 % lower bound of the
  mean paired gap (precision - FP32, nats, over the seeds where both ran) is above the margin;
- **overflow absorbed**: no harm, but the run met non-finite values: non-finite losses or GradScaler / apex skipped
  steps (an fp16 overflow, which the loss scaler answered by skipping the step and halving the scale);
- **clean**: neither.

A held-out gap whose interval straddles the margin is "not settled" by that many seeds; the text says so. The margin is
the claim's number (claimed at_least for a risk, at_most for a remedy), in nats per byte.

Risk claim (`risk: {models: [...]}`, "AMP is risky for X"): **holds** where an AMP precision of one of the models is
harmed (which, and how, named); **falls short** where none is (the text says whether overflows were seen and absorbed,
and whether "not worse" is settled at 95 % or only not shown); not measurable without FP32 and AMP cells.

Remedy claim (`risk: {remedies: [{risky, remedy, setting}]}`, "the remedy rescues it"): each remedy model's cells
(the variant precision, the risky model's settings plus the remedy) against the risky model's FP32 cells and its
cells at the same precision without the remedy. A remedy **rescues** where the unremedied cells were harmed and the
remedied ones are not; **does not rescue** where both are harmed; where the unremedied cells were not harmed there is
nothing to rescue (the text gives the skipped steps each way). The claim **holds** where every harmed risk is rescued
by at least one of its remedies, **falls short** where one is rescued by none; not measurable where no risk was
harmed here (nothing to rescue).
"""

from __future__ import annotations

import math

BASELINE = "fp32"
CLASSES = ("harmed", "overflow absorbed", "clean")
SETTLED = {"worse": "worse than FP32 beyond the margin", "not worse": "not worse than FP32 beyond the margin",
           "not settled": "not settled against the margin"}


def paired_interval(gaps: list[float]) -> dict | None:
    """Mean of paired per-seed gaps with its sample sd, two-sided 95 % Student-t interval (low, high) and one-sided
    95 % bounds (lower, upper); None for fewer than two gaps. The one place this module uses statistics: it reads the
    t quantiles of amprepro.analysis.fp8 until a shared paired-statistics module replaces both."""
    from amprepro.analysis.fp8 import seed_interval

    found = seed_interval(gaps)
    if found is None:
        return None
    return {"n": found["n"], "mean": found["mean"], "sd": found["sd"], "low": found["low"], "high": found["high"],
            "upper": found["upper"], "lower": 2 * found["mean"] - found["upper"]}


def cells_of(summary: dict, model: str, precision: str) -> dict[int, dict]:
    """seed -> summary row of one model and precision."""
    return {int(c["seed"]): c for c in summary.get("cells", [])
            if c["model"] == model and c["precision"] == precision}


def _heldout(row: dict | None) -> float | None:
    value = (row or {}).get("heldout_loss_final")
    return float(value) if row and row["status"] == "ok" and value is not None and math.isfinite(value) else None


def judge_cells(cells: dict[int, dict], fp32: dict[int, dict], margin: float) -> dict:
    """One precision's cells (seed -> row) against FP32's: the class, the signs behind it and the paired held-out
    gap. "ran" False (with reason) where no cell of it ran."""
    ran = {s: c for s, c in cells.items() if c["status"] in ("ok", "collapsed")}
    if not ran:
        statuses = sorted({f"{c['status']}: {c.get('reason') or 'no reason recorded'}" for c in cells.values()})
        return {"ran": False, "reason": "; ".join(statuses) or "no cell in this run"}
    collapsed = sorted(s for s, c in ran.items() if c["status"] == "collapsed")
    nonfinite = sum(int(c.get("nonfinite_steps") or 0) for c in ran.values())
    nonfinite_seeds = sorted(s for s, c in ran.items()
                             if c.get("nonfinite_steps") or c.get("first_nonfinite_step") is not None)
    skipped = sum(int(c.get("skipped_steps") or 0) for c in ran.values())
    scales = [c["loss_scale_final"] for c in ran.values() if c.get("loss_scale_final") is not None]
    gaps = {s: _heldout(c) - _heldout(fp32.get(s)) for s, c in ran.items()
            if _heldout(c) is not None and _heldout(fp32.get(s)) is not None}
    interval = paired_interval(list(gaps.values()))
    settled = None
    if interval:
        settled = ("worse" if interval["lower"] > margin else "not worse" if interval["upper"] < margin
                   else "not settled")
    harmed = bool(collapsed) or settled == "worse"
    overflow = bool(nonfinite_seeds) or skipped > 0
    kind = "harmed" if harmed else "overflow absorbed" if overflow else "clean"
    return {"ran": True, "class": kind, "seeds": sorted(ran), "collapsed_seeds": collapsed,
            "nonfinite_steps": nonfinite, "nonfinite_seeds": nonfinite_seeds, "skipped_steps": skipped,
            "loss_scale_final_min": min(scales) if scales else None, "gaps": gaps, "interval": interval,
            "settled": settled, "margin": margin}


def _scale_text(scale: float | None) -> str:
    if scale is None:
        return ""
    if scale > 0 and math.log2(scale).is_integer():
        return f"; lowest final loss scale 2^{int(math.log2(scale))}"
    return f"; lowest final loss scale {scale:.3g}"


def judged_text(precision: str, judged: dict) -> str:
    """'amp_fp16: harmed: collapsed in 4 of 4 seeds; 212 non-finite steps in 4 seeds, 230 skipped steps; held-out
    gap ...'."""
    if not judged["ran"]:
        return f"{precision}: did not run ({judged['reason']})"
    n = len(judged["seeds"])
    parts = []
    if judged["collapsed_seeds"]:
        parts.append(f"collapsed in {len(judged['collapsed_seeds'])} of {n} seeds")
    parts.append(f"{judged['nonfinite_steps']} non-finite steps in {len(judged['nonfinite_seeds'])} of {n} seeds, "
                 f"{judged['skipped_steps']} skipped steps{_scale_text(judged['loss_scale_final_min'])}")
    interval = judged["interval"]
    if interval:
        parts.append(f"held-out loss vs FP32 {interval['mean']:+.4f} nats (95 % {interval['low']:+.4f} to "
                     f"{interval['high']:+.4f}, {interval['n']} paired seeds): {SETTLED[judged['settled']]} "
                     f"{judged['margin']:g}")
    else:
        parts.append(f"held-out loss vs FP32: {len(judged['gaps'])} paired seed(s) with a finite held-out loss, "
                     "fewer than the 2 an interval needs")
    return f"{precision}: {judged['class']}: " + "; ".join(parts)


def model_risk(summary: dict, model: str, margin: float) -> dict:
    """Every precision of `model` other than FP32, judged against its FP32 cells; {"model", "precisions", "reason"}."""
    fp32 = cells_of(summary, model, BASELINE)
    out = {"model": model, "precisions": {}, "reason": ""}
    if not any(c["status"] == "ok" for c in fp32.values()):
        out["reason"] = f"no {model}/{BASELINE} cell that ran ok in this run"
        return out
    present = list(dict.fromkeys(c["precision"] for c in summary.get("cells", []) if c["model"] == model))
    for precision in present:
        if precision != BASELINE:
            out["precisions"][precision] = judge_cells(cells_of(summary, model, precision), fp32, margin)
    if not any(j["ran"] for j in out["precisions"].values()):
        out["reason"] = f"no AMP cell of {model} ran"
    return out


def _not_measurable(reason: str) -> dict:
    return {"verdict": "not_measurable", "verdict_text": "not measurable here", "reason": reason,
            "measured_text": "", "by_baseline": {}}


def judge_risk(claim: dict, summary: dict) -> dict:
    """The verdict of a risk claim ("AMP is risky for ...") from the cells of claim["risk"]["models"]."""
    margin = claim["claimed"]["at_least"]
    models = [model_risk(summary, m, margin) for m in claim["risk"]["models"]]
    measured = [m for m in models if not m["reason"]]
    if not measured:
        return _not_measurable("; ".join(m["reason"] for m in models))
    lines, harmed, absorbed, unsettled, per_model = [], [], [], [], {}
    for m in models:
        if m["reason"]:
            per_model[m["model"]] = {"verdict": "not_measurable", "reason": m["reason"], "measured_text": ""}
            continue
        model_lines = []
        for precision, judged in m["precisions"].items():
            model_lines.append(f"{m['model']}/{judged_text(precision, judged)}")
            if not judged["ran"]:
                continue
            name = f"{m['model']}/{precision}"
            if judged["class"] == "harmed":
                harmed.append(name)
            elif judged["class"] == "overflow absorbed":
                absorbed.append(name)
            if judged["settled"] in (None, "not settled") and judged["class"] != "harmed":
                unsettled.append(name)
        text = "; ".join(model_lines)
        lines += model_lines
        model_harmed = any(j["ran"] and j["class"] == "harmed" for j in m["precisions"].values())
        per_model[m["model"]] = {"verdict": "holds" if model_harmed else "falls_short", "reason": text,
                                 "measured_text": text, "precisions": m["precisions"]}
    if harmed:
        verdict, text = "holds", f"holds: AMP harmed {', '.join(harmed)}"
    else:
        verdict = "falls_short"
        text = ("falls short: no AMP cell harmed here"
                + (f" (overflows absorbed by the loss scale in {', '.join(absorbed)})" if absorbed
                   else " (no overflow either)")
                + (f"; not worse than FP32 shown at 95 % only where settled (not settled: {', '.join(unsettled)})"
                   if unsettled else ""))
    reason = "; ".join(lines)
    return {"verdict": verdict, "verdict_text": text, "reason": reason, "measured_text": reason,
            "by_baseline": {BASELINE: {"verdict": verdict, "reason": reason, "models": per_model}}}


# A remedy's outcome as the verdict its line in the report shows (amprepro.analysis.claims.VERDICT_TEXT).
OUTCOME_VERDICT = {"rescues": "holds", "does not rescue": "falls_short", "nothing to rescue": "nothing_to_rescue",
                   "not measured": "not_measurable"}


def remedy_outcome(without: dict, remedied: dict) -> str:
    """rescues / does not rescue / nothing to rescue / not measured, from the classes of the risky model's cells at
    the variant precision without and with the remedy."""
    if not without["ran"] or not remedied["ran"]:
        return "not measured"
    if without["class"] != "harmed":
        return "nothing to rescue"
    return "does not rescue" if remedied["class"] == "harmed" else "rescues"


def judge_remedies(claim: dict, summary: dict) -> dict:
    """The verdict of a remedy claim from each {risky, remedy, setting} of claim["risk"]["remedies"]."""
    margin, variant = claim["claimed"]["at_most"], claim["variant"]
    entries, lines, harmed_risks = [], [], {}
    for item in claim["risk"]["remedies"]:
        risky, remedy = item["risky"], item["remedy"]
        fp32 = cells_of(summary, risky, BASELINE)
        if not any(c["status"] == "ok" for c in fp32.values()):
            lines.append(f"{remedy}: no {risky}/{BASELINE} cell that ran ok")
            continue
        without = judge_cells(cells_of(summary, risky, variant), fp32, margin)
        remedied = judge_cells(cells_of(summary, remedy, variant), fp32, margin)
        outcome = remedy_outcome(without, remedied)
        setting = item.get("setting") or remedy
        line = (f"{risky} + {setting}: {outcome} (without: {judged_text(variant, without)} | with: "
                f"{judged_text(variant, remedied)})")
        entries.append({"risky": risky, "remedy": remedy, "setting": setting, "outcome": outcome,
                        "without": without, "with": remedied, "text": line})
        if without["ran"] and without["class"] == "harmed":
            harmed_risks.setdefault(risky, []).append(outcome)
        lines.append(line)
    reason = "; ".join(lines)
    if not any(e["without"]["ran"] and e["with"]["ran"] for e in entries):
        return {**_not_measurable(f"no risk model ran {variant} both with and without a remedy here: {reason}"),
                "remedies": entries}
    if not harmed_risks:
        why = "nothing to rescue: no risk model's " + variant + " cells were harmed here"
        text = f"{why}; {reason}" if reason else why
        return {"verdict": "nothing_to_rescue", "verdict_text": "nothing to rescue here", "reason": text,
                "measured_text": text, "remedies": entries, "by_baseline": {}}
    unrescued = [risky for risky, outcomes in harmed_risks.items() if "rescues" not in outcomes]
    rescued = [risky for risky in harmed_risks if risky not in unrescued]
    if unrescued:
        verdict = "falls_short"
        text = f"falls short: no remedy rescued {', '.join(unrescued)}"
    else:
        verdict = "holds"
        text = f"holds: rescued {', '.join(rescued)}"
    by_setting = [f"{e['setting']} on {e['risky']}: {e['outcome']}" for e in entries]
    per_remedy = {e["remedy"]: {"verdict": OUTCOME_VERDICT[e["outcome"]], "reason": e["text"],
                                "measured_text": e["text"]} for e in entries}
    return {"verdict": verdict, "verdict_text": f"{text} ({'; '.join(by_setting)})", "reason": reason,
            "measured_text": reason, "remedies": entries,
            "by_baseline": {BASELINE: {"verdict": verdict, "reason": reason, "models": per_remedy}}}


def claimed_text(claim: dict) -> str:
    if "models" in claim["risk"]:
        return (f"harm: a collapse, or a final held-out loss above FP32's by more than "
                f"{claim['claimed']['at_least']:g} nats (one-sided 95 % over paired seeds)")
    return (f"the remedied {claim['variant']} cells not harmed (no collapse; held-out loss not above FP32's by more "
            f"than {claim['claimed']['at_most']:g} nats at 95 %) where the unremedied ones were")


def evaluate_claim(claim: dict, summary: dict) -> dict:
    """The whole result of a claim with a `risk:` block, in the form amprepro.analysis.claims gives every claim."""
    wanted = claim["risk"].get("models") or [m for item in claim["risk"]["remedies"]
                                             for m in (item["risky"], item["remedy"])]
    if not any(c["model"] in wanted for c in summary.get("cells", [])):  # a run without the risk preset's cells
        judged = {**_not_measurable(f"no {', '.join(dict.fromkeys(wanted))} cell ran (--config preset=risk)"),
                  "risk_preset": True}
    else:
        judged = judge_risk(claim, summary) if "models" in claim["risk"] else judge_remedies(claim, summary)
    return {"id": claim["id"], "statement": claim["statement"], "model": claim["model"], "models": claim["models"],
            "metric": claim["metric"], "variant": claim["variant"], "baselines": claim["baseline"],
            "claimed": claim["claimed"], "tolerance": claim["tolerance"], "claimed_text": claimed_text(claim),
            "source": claim["source"], "note": claim.get("note", ""), "caveats": claim.get("caveats", []),
            "matched_models": [m for m in claim["models"]
                               if any(c["model"] == m for c in summary.get("cells", []))],
            **judged}
