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

Run as a module it prints the verdicts: ``python -m amprepro.claims --claims config/claims.yaml --summary ...``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import jsonschema
import yaml

from amprepro import precisions
from amprepro.precisions import label as precision_label
from amprepro.schemaerrors import bounded_message, field_name, first_error

VERDICT_TEXT = {"holds": "holds", "exceeds": "exceeds the claim", "falls_short": "falls short",
                "depends_on_baseline": "depends on the baseline", "not_measurable": "not measurable here"}
# Which side of the claimed band is better for the variant, per metric: more speed, a bigger memory saving and a
# higher accuracy are all better, so a value above the band exceeds the claim and one below it falls short.
HIGHER_IS_BETTER = {"speedup": True, "memory_reduction": True, "accuracy_delta": True}
# A generic claim's verdict over several models is the worst of theirs, in this order (first = worst).
WORST_FIRST = ["falls_short", "exceeds", "holds"]
EPS = 1e-9

_NUMBER = {"type": "number"}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "description": "config/claims.yaml: the claims the report evaluates (docs/report.md describes every field)",
    "type": "object",
    "additionalProperties": False,
    "required": ["claims"],
    "properties": {
        "claims": {"type": "array", "items": {"$ref": "#/$defs/claim"}},
    },
    "$defs": {
        "precision": {"enum": []},  # precisions.names(), filled in by schema()
        "claim": {
            "type": "object",
            "additionalProperties": False,
            "required": ["id", "source", "statement", "model", "models", "metric", "baseline", "variant", "claimed",
                         "tolerance"],
            "properties": {
                "id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]*$",
                       "description": "unique, lower-case letters, digits, '-', '_', '.'"},
                "source": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["file", "title"],
                    "properties": {
                        "file": {"type": "string", "minLength": 1, "description": "the article (seed file name)"},
                        "title": {"type": "string", "minLength": 1},
                        "quote": {"type": "string", "description": "the sentence that makes the claim, verbatim"},
                        "url": {"type": "string"},
                    },
                },
                "statement": {"type": "string", "minLength": 1, "description": "the claim, in one English sentence"},
                "model": {"type": "string", "minLength": 1, "description": "the model as the article names it"},
                "models": {
                    "type": "array", "minItems": 1, "uniqueItems": True,
                    "items": {"type": "string", "pattern": "^[A-Za-z0-9_]+$"},
                    "description": ("cell models (config names or archs) that stand for it; [any] = every model; "
                                    "[benchmark] = every model on synthetic data"),
                },
                "metric": {"enum": list(HIGHER_IS_BETTER)},
                "baseline": {
                    "oneOf": [{"$ref": "#/$defs/precision"},
                              {"type": "array", "minItems": 1, "uniqueItems": True,
                               "items": {"$ref": "#/$defs/precision"}}],
                },
                "variant": {"$ref": "#/$defs/precision"},
                "claimed": {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "about": _NUMBER, "at_least": _NUMBER, "at_most": _NUMBER,
                        "between": {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2},
                    },
                },
                "tolerance": {"type": "number", "minimum": 0,
                              "description": "in the metric's units: x for speedup, a fraction for memory_reduction"},
                "requires": {"type": "array", "uniqueItems": True, "items": {"enum": ["tensor_cores"]}},
                "not_measurable": {"type": "string", "minLength": 1,
                                   "description": "why no run of this pipeline can test the claim as stated"},
                "proxy": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["models", "note"],
                    "properties": {
                        "models": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                        "note": {"type": "string"},
                    },
                },
                "note": {"type": "string"},
                "caveats": {"type": "array", "items": {"type": "string", "minLength": 1},
                            "description": "what a reader must know to read the verdict; the report lists them"},
            },
        },
    },
}


def schema() -> dict:
    """SCHEMA with the precision enum read from the registry."""
    return {**SCHEMA, "$defs": {**SCHEMA["$defs"], "precision": {"enum": precisions.names()}}}


class ClaimsError(ValueError):
    """config/claims.yaml is wrong; the message names the claim and the field."""


# ----------------------------------------------------------------------------------------------------------------------
# Loading and validation


def _claim_id_label(claims: list) -> Callable[[list], str]:
    """Labels claims[i] with its id, so that the message names the claim as the file's reader knows it."""
    def label(path: list) -> str:
        if len(path) == 2 and path[0] == "claims" and isinstance(path[1], int) and path[1] < len(claims):
            claim_id = claims[path[1]].get("id") if isinstance(claims[path[1]], dict) else None
            return f" (id {claim_id!r})" if claim_id else ""
        return ""
    return label


def validate(data, where: str = "config/claims.yaml") -> list[dict]:
    """Validate parsed claims.yaml; return the claims with `baseline` normalised to a list."""
    if not isinstance(data, dict):
        raise ClaimsError(f"{where}: expected a mapping with a `claims:` list, got {type(data).__name__}.")
    claims = data.get("claims") if isinstance(data.get("claims"), list) else []
    validator = jsonschema.Draft202012Validator(schema())
    error = first_error(validator, data)
    if error is not None:
        raise ClaimsError(f"{where}: claim field {field_name(error, label=_claim_id_label(claims))}: "
                          f"{bounded_message(error)}. Fix that field (docs/report.md lists the claim fields).")
    seen = {}
    for index, claim in enumerate(claims):
        field = f"claims[{index}] (id {claim['id']!r})"
        if claim["id"] in seen:
            raise ClaimsError(f"{where}: claim field {field}.id: duplicate id, also used by claims[{seen[claim['id']]}].")
        seen[claim["id"]] = index
        claim["baseline"] = [claim["baseline"]] if isinstance(claim["baseline"], str) else list(claim["baseline"])
        if claim["variant"] in claim["baseline"]:
            raise ClaimsError(f"{where}: claim field {field}.variant: {claim['variant']!r} is also a baseline.")
        between = claim["claimed"].get("between")
        if between and between[0] > between[1]:
            raise ClaimsError(f"{where}: claim field {field}.claimed.between: {between} is not [low, high].")
    return claims


def load_claims(path: str | Path) -> list[dict]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ClaimsError(f"{path}: no claims file. Fix: restore it from the repository.") from None
    except yaml.YAMLError as exc:
        raise ClaimsError(f"{path}: not valid YAML: {exc}") from None
    return validate(data, str(path))


# ----------------------------------------------------------------------------------------------------------------------
# Metrics


def _peak_gpu(row):
    return row.get("peak_allocated_bytes")


def metric_value(metric: str, variant: dict, baseline: dict) -> tuple[float | None, str]:
    """(value, why-not) for one seed's pair of cells."""
    if metric == "speedup":
        v, b = variant.get("throughput_per_s"), baseline.get("throughput_per_s")
        if not v or not b:
            return None, "no throughput recorded"
        return v / b, ""
    if metric == "memory_reduction":
        v, b = _peak_gpu(variant), _peak_gpu(baseline)
        if not v or not b:
            if variant.get("peak_rss_bytes") or baseline.get("peak_rss_bytes"):
                return None, ("peak memory here is the CPU process RSS, not the GPU allocator peak the claim is "
                              "about")
            return None, "no peak memory recorded"
        return 1.0 - v / b, ""
    if metric == "accuracy_delta":
        v, b = variant.get("eval_accuracy"), baseline.get("eval_accuracy")
        if v is None or b is None:
            return None, f"no eval accuracy: {variant['model']} trains on synthetic tensors here (throughput only)"
        return v - b, ""
    raise ValueError(f"unknown metric {metric}")


def fmt_value(metric: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if metric == "speedup":
        return f"{value:.2f}×"
    if metric == "memory_reduction":
        return f"{-value * 100:+.1f} %".replace("-", "−")
    if metric == "accuracy_delta":
        return f"{value * 100:+.2f} pp".replace("-", "−")
    return f"{value:.3g}"


def fmt_range(metric: str, low: float, high: float) -> str:
    """A band in display order (memory reductions shown as negative changes, smaller magnitude first)."""
    return f"{fmt_value(metric, low)} to {fmt_value(metric, high)}"


def claimed_band(claim: dict) -> tuple[float, float]:
    """The accepted interval [low, high] for the measured value (infinite where the claim is one-sided)."""
    c, tol = claim["claimed"], claim["tolerance"]
    if "about" in c:
        return c["about"] - tol, c["about"] + tol
    if "at_least" in c:
        return c["at_least"] - tol, float("inf")
    if "at_most" in c:
        return float("-inf"), c["at_most"] + tol
    low, high = c["between"]
    return low - tol, high + tol


def claimed_text(claim: dict) -> str:
    c, metric, tol = claim["claimed"], claim["metric"], claim["tolerance"]
    low, high = claimed_band(claim)
    if "about" in c:
        return f"about {fmt_value(metric, c['about'])} (accepted {fmt_range(metric, low, high)})"
    if "at_least" in c:
        return f"at least {fmt_value(metric, c['at_least'])}" + (f" (accepted from {fmt_value(metric, low)})" if tol else "")
    if "at_most" in c:
        return f"at most {fmt_value(metric, c['at_most'])}" + (f" (accepted to {fmt_value(metric, high)})" if tol else "")
    return (f"{fmt_range(metric, *c['between'])}"
            + (f" (accepted {fmt_range(metric, low, high)})" if tol else ""))


def in_band(claim: dict, value: float) -> bool:
    low, high = claimed_band(claim)
    return low - EPS <= value <= high + EPS


def verdict_for(claim: dict, value: float) -> str:
    """holds (in the band), exceeds (outside it on the better side) or falls_short (outside it on the worse side)."""
    if in_band(claim, value):
        return "holds"
    above = value > claimed_band(claim)[1]
    return "exceeds" if above == HIGHER_IS_BETTER[claim["metric"]] else "falls_short"


def _direction(claim: dict, value: float) -> str:
    low, high = claimed_band(claim)
    return "above the claimed band" if value > high else "below the claimed band" if value < low else "in the band"


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


def _model_config_field(runs_dir: str | Path | None, field: str) -> dict:
    """Cell model name -> one field of its model_config, read from the cells' metrics.json."""
    values = {}
    if runs_dir and Path(runs_dir).is_dir():
        for path in sorted(Path(runs_dir).glob("*/*/seed*/metrics.json")):
            try:
                spec = json.loads(path.read_text()).get("spec", {})
            except (OSError, ValueError):
                continue
            value = spec.get("model_config", {}).get(field)
            if value:
                values.setdefault(path.parts[-4], value)
    return values


def model_archs(runs_dir: str | Path | None) -> dict:
    """Cell model name -> architecture (so claims can match an arch too)."""
    return _model_config_field(runs_dir, "arch")


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
    return {(c["model"], c["precision"], int(c["seed"])): c for c in summary.get("cells", [])}


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n_seeds": len(values)}


def evaluate_model(claim: dict, cells: dict, model: str, baseline: str) -> dict:
    """One model against one baseline: the per-seed values, their median and spread, and the verdict."""
    variant, metric = claim["variant"], claim["metric"]
    seeds = sorted({s for (m, p, s) in cells if m == model and p in (variant, baseline)})
    out = {"model": model, "baseline": baseline, "variant": variant, "values": {}, "verdict": "not_measurable",
           "reason": ""}
    var = {s: cells.get((model, variant, s)) for s in seeds}
    base = {s: cells.get((model, baseline, s)) for s in seeds}
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
    why = ""
    for seed in seeds:
        v, b = var.get(seed), base.get(seed)
        if v and b and v["status"] == "ok" and b["status"] == "ok":
            value, why_not = metric_value(metric, v, b)
            if value is None:
                why = why or why_not
            else:
                out["values"][seed] = value
    if not out["values"]:
        out["reason"] = why or f"no seed where both {model}/{variant} and {model}/{baseline} ran"
        return out
    stats = _stats(list(out["values"].values()))
    out.update(stats)
    out["verdict"] = verdict_for(claim, stats["median"])
    out["borderline"] = len({verdict_for(claim, stats[k]) for k in ("min", "median", "max")}) > 1
    out["measured_text"] = measured_text(metric, stats)
    out["reason"] = (f"{model}: {out['measured_text']}"
                     + ("" if out["verdict"] == "holds" else f", {_direction(claim, stats['median'])}")
                     + (" (the spread straddles the band edge)" if out["borderline"] else ""))
    return out


def measured_text(metric: str, stats: dict) -> str:
    text = fmt_value(metric, stats["median"])
    if stats["n_seeds"] > 1:
        text += f" (min–max {fmt_value(metric, stats['min'])} to {fmt_value(metric, stats['max'])}, {stats['n_seeds']} seeds)"
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


def evaluate_claim(claim: dict, summary: dict, sanity: dict | None = None, archs: dict | None = None,
                   use_override: bool = True, data: dict | None = None) -> dict:
    """The verdict of one claim on this run, with every number behind it; where this run cannot judge it, the proxy
    models (if the claim names some) are judged as context."""
    result = _judge(claim, summary, sanity, archs or {}, use_override, data)
    if result["verdict"] == "not_measurable" and claim.get("proxy"):
        proxy_claim = {key: value for key, value in claim.items() if key not in ("proxy", "not_measurable")}
        proxy_claim.update(models=claim["proxy"]["models"], model="/".join(claim["proxy"]["models"]))
        proxy = _judge(proxy_claim, summary, sanity, archs or {}, False, data)
        result["proxy"] = {"note": claim["proxy"]["note"], "models": claim["proxy"]["models"],
                           "verdict": proxy["verdict"], "verdict_text": proxy["verdict_text"],
                           "reason": proxy["reason"], "measured_text": proxy["measured_text"],
                           "by_baseline": proxy["by_baseline"]}
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
    models = matching_models(claim["models"], present, archs, data)
    named = {m.lower() for m in claim["models"]}
    # A variant of the architecture (e.g. vit_b_16_compile) counts only where it ran the claim's variant precision.
    models = [m for m in models if m.lower() in named or any(k[:2] == (m, claim["variant"]) for k in cells)]
    result["matched_models"] = models
    generic = bool(named & {"any", "benchmark"})
    if models or generic:  # a missing named model is the first thing to say; a generic claim needs the hardware
        if "tensor_cores" in claim.get("requires", []):
            ok, detail = tensor_cores(sanity, summary)
            if not ok:
                return not_measurable(f"needs a Tensor Core GPU (compute capability ≥ 7.0); {detail}: "
                                      f"{run_context(summary)}")
    if not models:
        here = ", ".join(present) or "none"
        return not_measurable(f"no {claim['model']} cell ran ({'/'.join(claim['models'])}): "
                              f"{run_context(summary)} (models here: {here})")
    for baseline in claim["baseline"]:
        # Only models whose preset has this baseline (a cell that failed or was skipped still has a row).
        scoped = [m for m in models if m.lower() in named or any(k[:2] == (m, baseline) for k in cells)]
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
             data: dict | None = None) -> list[dict]:
    return [evaluate_claim(claim, summary, sanity, archs, data=data) for claim in claims]


def evaluate_run(claims_path: str | Path, summary: dict, sanity: dict | None,
                 runs_dir: str | Path | None) -> list[dict]:
    """The one evaluation of a run's claims: the CLI, verify and the report all call this, so they agree."""
    return evaluate(load_claims(claims_path), summary, sanity, model_archs(runs_dir), model_data(runs_dir))


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
