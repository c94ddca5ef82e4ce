"""The blog posts' claims as data (config/claims.yaml), validated, and evaluated against one run of the pipeline.

A claim names a metric (speedup, memory_reduction, accuracy_delta), a variant precision, one or more baselines
(strict FP32 and TF32 are evaluated separately), the models that stand for the article's model, the claimed value
(about / at_least / at_most / between) and a tolerance in the metric's own units. Each claim gets one verdict:

- ``holds``: the median over seeds is inside the claimed band (claimed ± tolerance; spread: min-max);
- ``exceeds``: outside the band on the better side (HIGHER_IS_BETTER says which side that is, per metric);
- ``falls_short``: outside the band on the worse side, or the variant collapsed;
- ``depends_on_baseline``: the verdicts against strict FP32 and against TF32 differ (both are named);
- ``not_measurable``: this run cannot say, with the reason (no such model ran, cell skipped, no Tensor Cores, ...).

A one-sided claim misses on one side only: ``at_least`` can hold or fall short, ``at_most`` can hold or (for a metric
where higher is better) exceed the claim. docs/report.md has the table.

The claims file is read by amprepro.report.claimfile, values and bands are amprepro.report.claimmetrics'.

Run as a module it prints the verdicts: ``python -m amprepro.report.claims --claims config/claims.yaml --summary ...``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from amprepro.cellid import CellId
from amprepro.precisions import label as precision_label
from amprepro.report import regimes as regimes_mod
from amprepro.report.claimfile import load_claims
from amprepro.report.claimmetrics import (
    band_side,
    claimed_text,
    decided_value,
    fmt_range,
    fmt_value,
    metric_bounds,
    verdict_for,
)

VERDICT_TEXT = {"holds": "holds", "exceeds": "exceeds the claim", "falls_short": "falls short",
                "depends_on_baseline": "depends on the baseline", "not_measurable": "not measurable here"}
# A generic claim's verdict over several models is the worst of theirs, in this order (first = worst).
WORST_FIRST = ["falls_short", "exceeds", "holds"]

# ----------------------------------------------------------------------------------------------------------------------
# Evaluation


def run_context(summary: dict) -> str:
    """'smoke preset on CPU' / 'paper preset on NVIDIA H200'."""
    preset = summary.get("preset", {}).get("preset", "?")
    gpu = summary.get("versions", {}).get("gpu")
    return f"{preset} preset on {gpu or 'CPU'}"


def tensor_cores(sanity: dict | None, summary: dict) -> tuple[bool, str]:
    for check in (sanity or {}).get("checks", []):
        if check.get("name") == "Tensor Cores":
            if check.get("status") == "pass":
                return True, check.get("detail", "")
            detail = check.get("detail") or "no Tensor Cores"
            return False, detail
    gpu = summary.get("versions", {}).get("gpu")
    return (False, "no CUDA GPU") if not gpu else (True, f"{gpu} (not checked)")


def _model_config_field(runs_dir: str | Path | None, field: str, top: bool = False) -> dict:
    """Cell model name -> one field of its model_config (top: of metrics.json itself), read from the cells'
    metrics.json."""
    values = {}
    if runs_dir and Path(runs_dir).is_dir():
        for path in sorted(Path(runs_dir).glob("*/*/seed*/metrics.json")):
            try:
                metrics = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            value = metrics.get(field) if top else metrics.get("spec", {}).get("model_config", {}).get(field)
            if value:
                values.setdefault(path.parts[-4], value)
    return values


def model_archs(runs_dir: str | Path | None) -> dict:
    """Cell model name -> architecture (so claims can match an arch too). A model on the empty-shell apex
    (apex_build: shell) stands for no architecture: a claim about apex (O1's speed, O2 against O1) is about a working
    build, and the shell is judged by its own claim (amprepro.report.envclaims)."""
    shells = _model_config_field(runs_dir, "apex_build")
    return {model: arch for model, arch in _model_config_field(runs_dir, "arch").items()
            if shells.get(model) != "shell"}


def model_data(runs_dir: str | Path | None) -> dict:
    """Cell model name -> its data ("digits", "synthetic_images", ...)."""
    return _model_config_field(runs_dir, "data")


def matching_models(claim_models: list[str], present: list[str], archs: dict, data: dict | None = None) -> list[str]:
    """[any]: every model; [benchmark]: models sized for throughput (synthetic data; the models trained on real data
    are small, for accuracy parity, and launch-bound); else models named so or of that architecture."""
    wanted = {m.lower() for m in claim_models}
    if "any" in wanted:
        return list(present)
    if "benchmark" in wanted:
        return [m for m in present if not (data or {}).get(m) or str(data[m]).startswith("synthetic")]
    return [m for m in present if m.lower() in wanted or str(archs.get(m, "")).lower() in wanted]


def _index(summary: dict) -> dict:
    return {CellId.of(c): c for c in summary.get("cells", [])}


def _has(cells: dict, model: str, precision: str) -> bool:
    """The summary has a row (of any status) of this model at this precision."""
    return any(c.model == model and c.precision == precision for c in cells)


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n_seeds": len(values)}


def evaluate_model(claim: dict, cells: dict, model: str, baseline: str) -> dict:
    """One model against one baseline: the per-seed values, their median and spread, and the verdict."""
    variant, metric = claim["variant"], claim["metric"]
    seeds = sorted({c.seed for c in cells if c.model == model and c.precision in (variant, baseline)})
    out = {"model": model, "baseline": baseline, "variant": variant, "values": {}, "verdict": "not_measurable",
           "reason": ""}
    var = {s: cells.get(CellId(model, variant, s)) for s in seeds}
    base = {s: cells.get(CellId(model, baseline, s)) for s in seeds}
    var_rows = [r for r in var.values() if r]
    base_rows = [r for r in base.values() if r]
    if not var_rows:
        out["reason"] = f"no {model}/{variant} cell in this run"
        return out
    collapsed = [r for r in var_rows if r["status"] == "collapsed"]
    if collapsed:
        step = collapsed[0].get("first_nonfinite_step")
        out.update(verdict="falls_short", reason=f"{model}/{variant} collapsed (non-finite loss"
                   + (f" at step {step}" if step is not None else "") + f", seed {collapsed[0]['seed']})")
        return out
    if not base_rows:
        out["reason"] = f"no {model}/{baseline} cell in this run"
        return out
    for rows, name in ((var_rows, variant), (base_rows, baseline)):
        if all(r["status"] != "ok" for r in rows):
            bad = rows[0]
            out["reason"] = f"{model}/{name} {bad['status']}: {bad.get('reason') or 'no reason recorded'}"
            return out
    shared = [r for r in var_rows + base_rows if r.get("gpu_shared_cells_per_gpu")]
    if metric == "speedup" and shared:  # amprepro.plan.resources.shares_gpu keeps every judged speed off these
        out["reason"] = (f"{shared[0]['model']}/{shared[0]['precision']} ran on a GPU shared with other untimed cells: "
                         "its throughput is not a speed measurement")
        return out
    why = ""
    for seed in seeds:
        v, b = var.get(seed), base.get(seed)
        if v and b and v["status"] == "ok" and b["status"] == "ok":
            low, high, why_not = metric_bounds(metric, v, b)
            value = None if low is None else decided_value(claim, low, high)
            if low is not None and value is None:
                why_not = (f"from {fmt_range(metric, low, high)} (seed {seed}), which straddles the claim's "
                           f"{claimed_text(claim)}: the searches did not narrow it enough")
            if value is None:
                why = why or why_not
            else:
                out["values"][seed] = value
                if low != high:
                    out.setdefault("bounds", {})[seed] = [low, high]
    if not out["values"]:
        out["reason"] = why or f"no seed where both {model}/{variant} and {model}/{baseline} ran"
        return out
    stats = _stats(list(out["values"].values()))
    out.update(stats)
    out["verdict"] = verdict_for(claim, stats["median"])
    out["borderline"] = len({verdict_for(claim, stats[k]) for k in ("min", "median", "max")}) > 1
    out["setting"] = setting_text(var_rows[0])
    out["measured_text"] = (measured_text(metric, stats) + bounds_text(metric, out.get("bounds"))
                            + (f" [{out['setting']}]" if out["setting"] else ""))
    out["reason"] = (f"{model}: {out['measured_text']}"
                     + ("" if out["verdict"] == "holds" else f", {band_side(claim, stats['median'])}")
                     + (" (the spread straddles the band edge)" if out["borderline"] else ""))
    return out


def setting_text(row: dict) -> str:
    """Where the memory plan ran this model at another batch or LLaMA shape than the preset's, which and why
    (amprepro.plan.memplan); empty where it ran as the preset says."""
    note = row.get("plan_note") or ""
    if row.get("shape_name"):  # the plan's note names the shape and its parameters
        return f"at the {note}" if note else f"at the {row['shape_name']} shape"
    batch, preset = row.get("batch_size"), row.get("preset_batch_size")
    if batch is not None and preset is not None and batch != preset:
        return f"at batch {batch}: {note}"
    return ""


def bounds_text(metric: str, bounds: dict | None) -> str:
    """' (bounded: 1.41× to unbounded)' where a seed's value stands for an interval its searches left
    (claimmetrics.decided_value)."""
    if not bounds:
        return ""
    return " (bounded: " + "; ".join(f"{fmt_range(metric, low, high)}" for low, high in bounds.values()) + ")"


def measured_text(metric: str, stats: dict) -> str:
    text = fmt_value(metric, stats["median"])
    if stats["n_seeds"] > 1:
        text += (f" (min–max {fmt_value(metric, stats['min'])} to {fmt_value(metric, stats['max'])}, "
                 f"{stats['n_seeds']} seeds)")
    else:
        text += " (1 seed)"
    return text


def _grouped_reasons(rows: list[dict]) -> str:
    """'amp_fp16 skipped: no CUDA GPU here (cnn, transformer)' rather than the same reason once per model."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        why = r["reason"].removeprefix(f"{r['model']}/")
        groups.setdefault(why, []).append(r["model"])
    if len(groups) == 1 and len(rows) == 1:
        return rows[0]["reason"]
    return "; ".join(f"{why} ({', '.join(models)})" for why, models in groups.items())


def _aggregate(per_model: list[dict]) -> dict:
    measurable = [r for r in per_model if r["verdict"] != "not_measurable"]
    if not measurable:
        return {"verdict": "not_measurable", "reason": _grouped_reasons(per_model)}
    verdicts = {r["verdict"] for r in measurable}
    verdict = next(v for v in WORST_FIRST if v in verdicts)
    reason = "; ".join(r["reason"] for r in measurable)
    if len(verdicts) > 1:
        split = "; ".join(f"{VERDICT_TEXT[v]} for {', '.join(r['model'] for r in measurable if r['verdict'] == v)}"
                          for v in reversed(WORST_FIRST) if v in verdicts)
        reason = f"{split} (of {len(measurable)} models): " + reason
    missing = [r for r in per_model if r["verdict"] == "not_measurable"]
    if missing:
        reason += "; not measured: " + _grouped_reasons(missing)
    return {"verdict": verdict, "reason": reason}


def no_model_ran(claim: dict, named: set[str]) -> str:
    """What did not run, in words: the article's model and its stand-ins, or for a generic claim (models [benchmark] or
    [any]) the kind of model it is evaluated on ("no any model (generic) cell ran (benchmark)" before)."""
    if "benchmark" in named:
        return "no benchmark model (synthetic data, sized for throughput) is in this run"
    if "any" in named:
        return "no model is in this run"
    return f"no {claim['model']} cell ran ({'/'.join(claim['models'])})"


def evaluate_claim(claim: dict, summary: dict, sanity: dict | None = None, archs: dict | None = None,
                   use_override: bool = True, data: dict | None = None, records: dict | None = None,
                   specs: dict | None = None) -> dict:
    """The verdict of one claim on this run, with every number behind it; where this run cannot judge it, the proxy
    models (if the claim names some) are judged as context, and a claim with `convergence:` models takes its verdict
    from their held-out losses (amprepro.report.convergence; records: model -> its cells' data record). A `judge:`
    claim (about the environment) is amprepro.report.envclaims' (specs: model -> its cells' spec); a `stability:`
    claim takes its verdict from amprepro.report.optlevels alone, a `risk:` claim from amprepro.report.riskclaims; a
    python_speedup claim is judged from its committed evidence file instead (amprepro.report.pythonclaim)."""
    if claim.get("metric") == "python_speedup":
        from amprepro.report import pythonclaim

        return pythonclaim.evaluate_claim(claim)
    if claim.get("risk"):  # AMP's risk points and their remedies (amprepro.report.riskclaims)
        from amprepro.report import riskclaims

        return riskclaims.evaluate_claim(claim, summary)
    if claim.get("judge"):
        from amprepro.report import envclaims

        return envclaims.judge(claim, summary, specs)
    result = _judge(claim, summary, sanity, archs or {}, use_override, data)
    if claim.get("stability"):  # an opt level's stability over seeds, not a metric per seed (amprepro.report.optlevels)
        from amprepro.report import optlevels

        result.update(optlevels.judge_claim(claim, summary), stability_models=claim["stability"]["models"])
        return result
    if result["verdict"] == "not_measurable" and claim.get("convergence"):
        from amprepro.report import convergence

        judged = convergence.judge_claim(claim, summary, records)
        if judged and judged["verdict"] == "not_measurable":
            result["reason"] = f"{result['reason']}; {judged['reason']}"
        elif judged:
            result.update(judged, convergence_models=claim["convergence"]["models"])
    if result["verdict"] == "not_measurable" and claim.get("proxy"):
        proxy_claim = {key: value for key, value in claim.items() if key not in ("proxy", "not_measurable")}
        proxy_claim.update(models=claim["proxy"]["models"], model="/".join(claim["proxy"]["models"]))
        proxy = _judge(proxy_claim, summary, sanity, archs or {}, False, data)
        result["proxy"] = {"note": claim["proxy"]["note"], "models": claim["proxy"]["models"],
                           "verdict": proxy["verdict"], "verdict_text": proxy["verdict_text"],
                           "reason": proxy["reason"], "measured_text": proxy["measured_text"],
                           "by_baseline": proxy["by_baseline"]}
    regimes = regimes_mod.for_claim(claim)  # the claim in other settings: predictions (and measurements) beside it
    if regimes:
        result["regimes"] = regimes
    return result


def _judge(claim: dict, summary: dict, sanity: dict | None, archs: dict, use_override: bool,
           data: dict | None) -> dict:
    cells = _index(summary)
    present = list(dict.fromkeys(c["model"] for c in summary.get("cells", [])))
    result = {
        "id": claim["id"], "statement": claim["statement"], "model": claim["model"], "models": claim["models"],
        "metric": claim["metric"], "variant": claim["variant"], "baselines": claim["baseline"],
        "claimed": claim["claimed"], "tolerance": claim["tolerance"], "claimed_text": claimed_text(claim),
        "source": claim["source"], "note": claim.get("note", ""), "caveats": claim.get("caveats", []),
        "by_baseline": {}, "matched_models": [],
    }

    def not_measurable(reason: str) -> dict:
        result.update(verdict="not_measurable", reason=reason, measured_text="")
        result["verdict_text"] = VERDICT_TEXT["not_measurable"]
        return result

    if use_override and claim.get("not_measurable"):
        return not_measurable(claim["not_measurable"])
    if claim.get("lora"):  # the largest shape a card LoRA-fine-tunes, over the LoRA cells
        from amprepro.report import loraclaim

        result.update(loraclaim.judge(claim, summary))
        result["verdict_text"] = VERDICT_TEXT[result["verdict"]]
        return result
    models = matching_models(claim["models"], present, archs, data)
    named = {m.lower() for m in claim["models"]}
    # A variant of the architecture (e.g. vit_b_16_compile) counts only where it ran the claim's variant precision.
    models = [m for m in models if m.lower() in named or _has(cells, m, claim["variant"])]
    result["matched_models"] = models
    generic = bool(named & {"any", "benchmark"})
    # a missing named model is the first thing to say; a generic claim needs the hardware
    if (models or generic) and "tensor_cores" in claim.get("requires", []):
        ok, detail = tensor_cores(sanity, summary)
        if not ok:
            return not_measurable(f"needs a Tensor Core GPU (compute capability ≥ 7.0); {detail}: "
                                  f"{run_context(summary)}")
    if not models:
        here = ", ".join(present) or "none"
        return not_measurable(f"{no_model_ran(claim, named)}: {run_context(summary)} (models here: {here})")
    for baseline in claim["baseline"]:
        # Only models whose preset has this baseline (a cell that failed or was skipped still has a row).
        scoped = [m for m in models if m.lower() in named or _has(cells, m, baseline)]
        per_model = [evaluate_model(claim, cells, model, baseline) for model in scoped]
        agg = _aggregate(per_model)
        result["by_baseline"][baseline] = {**agg, "models": {r["model"]: r for r in per_model}}
    measured = {b: r for b, r in result["by_baseline"].items() if r["verdict"] != "not_measurable"}
    if not measured:
        reasons = list(dict.fromkeys(r["reason"] for r in result["by_baseline"].values()))
        return not_measurable("; ".join(reasons))
    verdicts = {r["verdict"] for r in measured.values()}
    if len(verdicts) == 1:
        result["verdict"] = verdicts.pop()
        result["verdict_text"] = VERDICT_TEXT[result["verdict"]]
        if len(claim["baseline"]) > 1:
            result["verdict_text"] += " vs " + (" and ".join(precision_label(b) for b in measured)
                                                if len(measured) > 1 else precision_label(next(iter(measured))))
    else:
        result["verdict"] = "depends_on_baseline"
        result["verdict_text"] = "; ".join(f"{VERDICT_TEXT[r['verdict']]} vs {precision_label(b)}"
                                           for b, r in measured.items())
    parts = []
    for baseline, r in result["by_baseline"].items():
        parts.append(f"vs {precision_label(baseline)}: {r['reason']}")
    result["reason"] = " | ".join(parts)
    result["measured_text"] = "; ".join(
        f"vs {precision_label(b)}: " + ", ".join(
            (f"{m} " if len(r["models"]) > 1 else "") + (mr.get("measured_text") or "n/a")
            for m, mr in r["models"].items())
        for b, r in result["by_baseline"].items())
    return result


def evaluate(claims: list[dict], summary: dict, sanity: dict | None = None, archs: dict | None = None,
             data: dict | None = None, records: dict | None = None, specs: dict | None = None) -> list[dict]:
    return [evaluate_claim(claim, summary, sanity, archs, data=data, records=records, specs=specs)
            for claim in claims]


def evaluate_run(claims_path: str | Path, summary: dict, sanity: dict | None,
                 runs_dir: str | Path | None) -> list[dict]:
    """The one evaluation of a run's claims: the CLI, verify and the report all call this, so they agree."""
    return evaluate(load_claims(claims_path), summary, sanity, model_archs(runs_dir), model_data(runs_dir),
                    _model_config_field(runs_dir, "data_record", top=True),
                    _model_config_field(runs_dir, "spec", top=True))


def counts(results: list[dict]) -> dict:
    return {verdict: sum(r["verdict"] == verdict for r in results) for verdict in VERDICT_TEXT}


def summary_lines(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        line = f"{r['id']}: {r['verdict_text'].upper()}"
        detail = r["reason"] if r["verdict"] == "not_measurable" else r["measured_text"]
        lines.append(f"{line} — {detail} (claimed {r['claimed_text']})")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--claims", default="config/claims.yaml")
    parser.add_argument("--summary", default="results/summary/summary.json")
    parser.add_argument("--sanity", default="results/sanity/sanity.json")
    parser.add_argument("--runs-dir", default="results/runs")
    parser.add_argument("--json", help="write the evaluated claims here")
    args = parser.parse_args(argv)
    summary = json.loads(Path(args.summary).read_text())
    sanity = json.loads(Path(args.sanity).read_text()) if Path(args.sanity).exists() else None
    results = evaluate_run(args.claims, summary, sanity, args.runs_dir)
    for line in summary_lines(results):
        print(line)
    if args.json:
        from amprepro.files import write_json

        write_json(args.json, {"claims": results, "counts": counts(results)})


if __name__ == "__main__":
    main()
