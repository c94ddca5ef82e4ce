"""The Python 3.11 claim (metric python_speedup): judged from committed evidence, not from a run's cells.

The third article says Python 3.11 runs 25-60 % faster than 3.10 and that deep learning gains from it. No cell of a
run compares interpreters, so the evidence is a file under results-reference/python/ that
tools/python_speed/run.sh and summarize.py make: the pipeline's FP32 training step timed under both interpreters with
one torch build, per kind of cell (launch-bound, compute-bound), in interleaved rounds. This module turns those runs
into the evidence's numbers (summarize) and judges the claim from the runs themselves (judge), so a number in the
file that its runs do not give is never what the verdict reads.

The speedup of a round is the 3.10 step time over the 3.11 one, the two runs of that round being next to each other
in time (a change in the machine's load falls on both); a cell's value is the median over rounds, its spread their
min-max. The step time judged is the process's CPU time per step (JUDGED: the median over a run's timed steps of
time.process_time's difference), because the machine these runs share is busy with other work: a step's wall time
there counts the time it waited for the neighbours, its CPU time counts its own work. The wall-time speedups stand
beside it in the evidence, as context. Speedups are written as a change in speed ("+12.3 %": 3.11 does 12.3 % more
steps per second). Each kind of cell gets its own verdict; the claim's is the worst of them, and its text names each
kind ("launch-bound: +x %; compute-bound: +y %"), since the article's argument is about where Python's dispatch
matters.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from amprepro.analysis.claimmetrics import band_side, claimed_text, fmt_value, verdict_for

METRIC = "python_speedup"
BASELINE, VARIANT = "py310", "py311"  # the labels tools/python_speed/run.sh gives the two interpreters
REPO = Path(__file__).resolve().parents[3]
VERDICT_TEXT = {"holds": "holds", "exceeds": "exceeds the claim", "falls_short": "falls short",
                "not_measurable": "not measurable here"}
WORST_FIRST = ["falls_short", "exceeds", "holds"]
# The kind of tools/python_speed/bench.py's control cell (pure Python, no torch): shown beside the verdict, which it
# does not enter, to say whether the two interpreters differ as the article says on the work its benchmarks measure.
CONTROL_KIND = "pure-Python control"
JUDGED = "median_step_cpu_s"  # the step time the verdict reads (module docstring: why CPU time)
# Every step time a run carries (tools/python_speed/bench.py), by the name its speedup has in the evidence.
TIMES = {"cpu_median": "median_step_cpu_s", "wall_median": "median_step_s", "cpu_p10": "p10_step_cpu_s",
         "wall_p10": "p10_step_s"}


class EvidenceError(ValueError):
    """The evidence file is missing or malformed; the message names the file and what to run."""


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def cell_summary(runs: list[dict]) -> list[dict]:
    """Per cell, in the order first run: step times per interpreter and the per-round speedups (3.10 / 3.11)."""
    cells: dict[str, dict] = {}
    for run in runs:
        cell = cells.setdefault(run["cell"], {"cell": run["cell"], "kind": run["kind"], "rounds": {}})
        cell["rounds"].setdefault(run["round"], {})[run["label"]] = run
    out = []
    for name, cell in cells.items():
        paired = {r: pair for r, pair in sorted(cell["rounds"].items()) if BASELINE in pair and VARIANT in pair}
        if not paired:
            raise EvidenceError(f"cell {name}: no round has both a {BASELINE} and a {VARIANT} run")
        pairs = list(paired.values())
        first = pairs[0][BASELINE]
        entry = {"cell": name, "kind": cell["kind"], "model_config": first.get("model_config"),
                 "steps": first.get("steps"), "warmup_steps": first.get("warmup_steps"), "rounds": len(paired),
                 "judged_on": JUDGED, "step_s": {}, "speedups": {}}
        for what, key in TIMES.items():
            if all(key in pair[label] for pair in pairs for label in (BASELINE, VARIANT)):
                entry["step_s"][what] = {label: _spread([pair[label][key] for pair in pairs])
                                         for label in (BASELINE, VARIANT)}
                ratios = _spread([pair[BASELINE][key] / pair[VARIANT][key] for pair in pairs])
                entry["speedups"][what] = {**ratios, "text": fmt_value(METRIC, ratios["median"])}
        entry["speedup"] = {k: v for k, v in entry["speedups"]["cpu_median"].items() if k != "text"}
        entry["speedup_text"] = entry["speedups"]["cpu_median"]["text"]
        out.append(entry)
    return out


def load_evidence(path: str | Path, name: str | None = None) -> dict:
    """The evidence file's data; name: how messages call it (the claim's repository-relative path)."""
    path, shown = Path(path), name or str(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise EvidenceError(f"{shown}: no such evidence file. Fix: run tools/python_speed/run.sh and "
                            "tools/python_speed/summarize.py (tools/python_speed/README.md), or fix the claim's "
                            "evidence path") from None
    except ValueError as exc:
        raise EvidenceError(f"{shown}: not valid JSON ({exc}); re-create it with tools/python_speed/summarize.py") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise EvidenceError(f"{shown}: no `runs` list; re-create it with tools/python_speed/summarize.py")
    missing = [key for key in ("round", "label", "cell", "kind", JUDGED)
               if any(key not in run for run in data["runs"])]
    if missing:
        raise EvidenceError(f"{shown}: a run lacks {', '.join(missing)}; re-create it with "
                            "tools/python_speed/summarize.py")
    return data


def _verdict_text(verdict: str) -> str:
    return VERDICT_TEXT[verdict]


def judge(claim: dict, evidence: dict, where: str) -> dict:
    """The claim's result in the form claims.evaluate_claim returns, from the evidence's runs."""
    per_kind, controls = [], []
    for cell in cell_summary(evidence["runs"]):
        if cell["kind"] == CONTROL_KIND:
            controls.append(f"{CONTROL_KIND}, not judged: {cell['speedup_text']} ({cell['rounds']} rounds)")
            continue
        spread = cell["speedup"]
        verdict = verdict_for(claim, spread["median"])
        borderline = len({verdict_for(claim, spread[k]) for k in ("min", "median", "max")}) > 1
        wall = cell["speedups"].get("wall_median")
        text = (f"{cell['kind']}: {fmt_value(METRIC, spread['median'])} (min–max {fmt_value(METRIC, spread['min'])} "
                f"to {fmt_value(METRIC, spread['max'])}, {spread['n']} rounds; {cell['cell']}"
                + (f"; wall time {wall['text']}" if wall else "") + ")")
        per_kind.append({**cell, "verdict": verdict, "borderline": borderline, "measured_text": text,
                         "reason": text + ("" if verdict == "holds" else f", {band_side(claim, spread['median'])}")
                         + (" (the spread straddles the band edge)" if borderline else "")})
    if not per_kind:
        raise EvidenceError(f"{where}: no training-step cell, only the control; re-run tools/python_speed/run.sh")
    verdicts = {c["verdict"] for c in per_kind}
    verdict = next(v for v in WORST_FIRST if v in verdicts)
    verdict_text = _verdict_text(verdict)
    if len(verdicts) > 1:
        verdict_text = "; ".join(f"{_verdict_text(c['verdict'])} ({c['kind']})" for c in per_kind)
    interpreters = evidence.get("interpreters", {})
    versions = " vs ".join(interpreters.get(label, {}).get("version", label) for label in (VARIANT, BASELINE))
    context = (f"Python {versions}, torch {evidence.get('torch', {}).get('version', '?')}, CPU time per step, on "
               f"the CPU ({where})")
    context = "; ".join([*controls, context])
    return {"verdict": verdict, "verdict_text": verdict_text,
            "measured_text": "; ".join(c["measured_text"] for c in per_kind) + f" [{context}]",
            "reason": "; ".join(c["reason"] for c in per_kind) + f" [{context}]", "kinds": per_kind}


def evaluate_claim(claim: dict, root: str | Path | None = None) -> dict:
    """A python_speedup claim's result, with the keys every claim's result has (claims.evaluate_claim's); the
    evidence path is relative to the repository (root; default: the one this module is in)."""
    where = claim["evidence"]
    result = {"id": claim["id"], "statement": claim["statement"], "model": claim["model"], "models": claim["models"],
              "metric": claim["metric"], "variant": None, "baselines": [], "claimed": claim["claimed"],
              "tolerance": claim["tolerance"], "claimed_text": claimed_text(claim), "source": claim["source"],
              "note": claim.get("note", ""), "caveats": claim.get("caveats", []), "by_baseline": {},
              "matched_models": [], "evidence": where,
              "tested_text": f"Python {VARIANT[2]}.{VARIANT[3:]} vs {BASELINE[2]}.{BASELINE[3:]}: the pipeline's "
                             "FP32 training step on the CPU, from committed evidence"}
    try:  # a file that cannot be read, or whose runs pair no cell: said in the claim's reason, not a crash
        result.update(judge(claim, load_evidence(Path(root or REPO) / where, where), where))
    except EvidenceError as exc:
        result.update(verdict="not_measurable", verdict_text=VERDICT_TEXT["not_measurable"], reason=str(exc),
                      measured_text="")
    return result
