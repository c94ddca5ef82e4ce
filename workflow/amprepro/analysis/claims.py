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

The claims file is read by amprepro.analysis.claimfile, values and bands are amprepro.analysis.claimmetrics', one
model against one baseline is amprepro.analysis.claimmodels'.

Run as a module it prints the verdicts:
``python -m amprepro.analysis.claims --claims config/claims.yaml --summary ...``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from amprepro.analysis import regimes as regimes_mod
from amprepro.analysis.claimfile import load_claims
from amprepro.analysis.claimmetrics import claimed_text
from amprepro.analysis.claimmodels import VERDICT_TEXT, _has, _index, aggregate, evaluate_model, run_context
from amprepro.cellrecord import metrics_files
from amprepro.precisions import label as precision_label

# ----------------------------------------------------------------------------------------------------------------------
# Evaluation


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
    for path, metrics in metrics_files(runs_dir):
        value = metrics.get(field) if top else metrics.get("spec", {}).get("model_config", {}).get(field)
        if value:
            values.setdefault(path.parts[-4], value)
    return values


def model_archs(runs_dir: str | Path | None) -> dict:
    """Cell model name -> architecture (so claims can match an arch too). A model on the empty-shell apex
    (apex_build: shell) stands for no architecture: a claim about apex (O1's speed, O2 against O1) is about a working
    build, and the shell is judged by its own claim (amprepro.analysis.envclaims)."""
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
    from their held-out losses (amprepro.analysis.convergence; records: model -> its cells' data record). A `judge:`
    claim (about the environment) is amprepro.analysis.envclaims' (specs: model -> its cells' spec); a `stability:`
    claim takes its verdict from amprepro.analysis.optlevels alone, a `risk:` claim from amprepro.analysis.riskclaims; a
    python_speedup claim is judged from its committed evidence file instead (amprepro.analysis.pythonclaim)."""
    if claim.get("metric") == "python_speedup":
        from amprepro.analysis import pythonclaim

        return pythonclaim.evaluate_claim(claim)
    if claim.get("risk"):  # AMP's risk points and their remedies (amprepro.analysis.riskclaims)
        from amprepro.analysis import riskclaims

        return riskclaims.evaluate_claim(claim, summary)
    if claim.get("judge"):
        from amprepro.analysis import envclaims

        return envclaims.judge(claim, summary, specs)
    result = _judge(claim, summary, sanity, archs or {}, use_override, data)
    # an opt level's stability over seeds, not a metric per seed (amprepro.analysis.optlevels)
    if claim.get("stability"):
        from amprepro.analysis import optlevels

        result.update(optlevels.judge_claim(claim, summary), stability_models=claim["stability"]["models"])
        return result
    if result["verdict"] == "not_measurable" and claim.get("convergence"):
        from amprepro.analysis import convergence

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
        from amprepro.analysis import loraclaim

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
        agg = aggregate(per_model)
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
        detail = r["reason"] if r["verdict"] == "not_measurable" or not r["measured_text"] else r["measured_text"]
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
