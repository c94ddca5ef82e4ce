"""The Python 3.11 claim (metric python_speedup): its schema, its judgement from evidence runs by exact output, the
committed evidence, the python-axis env files and the benchmark's own step (on the CPU)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml
from report_helpers import CLAIMS, REPO, SMOKE

from amprepro.analysis import claimfile, claims, pythonclaim
from amprepro.analysis.claimmetrics import fmt_value
from amprepro.report import reporthtml

CLAIM = {"id": "py", "source": {"file": "004.txt", "title": "t"}, "statement": "3.11 is 25-60 % faster",
         "model": "any", "models": ["any"], "metric": "python_speedup", "evidence": "results-reference/python/e.json",
         "claimed": {"between": [1.25, 1.60]}, "tolerance": 0.0}


def run(round_, label, cell, seconds):
    """A run whose CPU time per step is `seconds` and whose wall time is twice that under 3.11 (a busy neighbour):
    the verdict reads the CPU time."""
    kind = "launch-bound" if cell.startswith("launch") else "compute-bound"
    wall = seconds * (2 if label == "py311" else 1)
    return {"round": round_, "label": label, "cell": cell, "kind": kind, "median_step_cpu_s": seconds,
            "median_step_s": wall, "p10_step_s": wall, "steps": 10, "warmup_steps": 2, "model_config": {"arch": "a"}}


# CPU time, launch: rounds give 0.013/0.010 = 1.3, 0.0126/0.009 = 1.4, 0.012/0.010 = 1.2 -> median 1.3 (holds);
# compute: 1.0, 1.02, 0.98 -> median 1.0 (falls short). The rounds' pairing, not the medians' ratio, gives them.
RUNS = [run(1, "py310", "launch_x", 0.013), run(1, "py311", "launch_x", 0.010),
        run(1, "py310", "compute_y", 0.5), run(1, "py311", "compute_y", 0.5),
        run(2, "py311", "launch_x", 0.009), run(2, "py310", "launch_x", 0.0126),
        run(2, "py311", "compute_y", 0.5), run(2, "py310", "compute_y", 0.51),
        run(3, "py310", "launch_x", 0.012), run(3, "py311", "launch_x", 0.010),
        run(3, "py310", "compute_y", 0.49), run(3, "py311", "compute_y", 0.5)]


def write_evidence(root: Path, runs: list[dict]) -> None:
    path = root / "results-reference" / "python" / "e.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"interpreters": {"py310": {"version": "3.10.13"}, "py311": {"version": "3.11.7"}},
                                "torch": {"version": "2.13.0+cu130"}, "runs": runs}))


def test_the_speedup_is_written_as_a_change_in_steps_per_second():
    assert fmt_value("python_speedup", 1.25) == "+25.0 %" and fmt_value("python_speedup", 0.9) == "−10.0 %"


def test_cell_summary_pairs_each_rounds_runs():
    launch, compute = pythonclaim.cell_summary(RUNS)
    assert launch["cell"] == "launch_x" and launch["rounds"] == 3
    assert launch["speedup"] == pytest.approx({"median": 1.3, "min": 1.2, "max": 1.4, "n": 3})
    assert launch["speedup_text"] == "+30.0 %" and launch["judged_on"] == "median_step_cpu_s"
    assert compute["speedup"] == pytest.approx({"median": 1.0, "min": 0.98, "max": 1.02, "n": 3})
    assert launch["step_s"]["cpu_median"]["py310"] == pytest.approx(
        {"median": 0.0126, "min": 0.012, "max": 0.013, "n": 3})
    assert launch["speedups"]["wall_median"]["text"] == "−35.0 %"
    assert launch["speedups"]["wall_p10"]["median"] == pytest.approx(0.65)
    assert set(launch["speedups"]) == {"cpu_median", "wall_median", "wall_p10"}  # no CPU-time p10 in these runs


def test_a_round_with_one_interpreter_only_is_left_out_and_a_cell_without_pairs_is_refused():
    one_sided = [*RUNS, run(4, "py310", "launch_x", 1.0)]
    assert pythonclaim.cell_summary(one_sided)[0]["rounds"] == 3
    with pytest.raises(pythonclaim.EvidenceError, match="cell z: no round has both a py310 and a py311 run"):
        pythonclaim.cell_summary([run(1, "py310", "z", 1.0)])


def test_the_verdict_names_each_kind_and_is_the_worst_of_them(tmp_path):
    write_evidence(tmp_path, RUNS)
    result = pythonclaim.evaluate_claim(CLAIM, tmp_path)
    assert result["verdict"] == "falls_short"
    assert result["verdict_text"] == "holds (launch-bound); falls short (compute-bound)"
    context = (" [Python 3.11.7 vs 3.10.13, torch 2.13.0+cu130, CPU time per step, on the CPU "
               "(results-reference/python/e.json)]")
    assert result["measured_text"] == (
        "launch-bound: +30.0 % (min–max +20.0 % to +40.0 %, 3 rounds; launch_x; wall time −35.0 %); "
        "compute-bound: +0.0 % (min–max −2.0 % to +2.0 %, 3 rounds; compute_y; wall time −50.0 %)" + context)
    assert result["reason"] == (
        "launch-bound: +30.0 % (min–max +20.0 % to +40.0 %, 3 rounds; launch_x; wall time −35.0 %) (the spread "
        "straddles the band edge); compute-bound: +0.0 % (min–max −2.0 % to +2.0 %, 3 rounds; compute_y; wall time "
        "−50.0 %), below the claimed band" + context)
    assert result["claimed_text"] == "+25.0 % to +60.0 %"
    assert result["evidence"] == "results-reference/python/e.json" and result["by_baseline"] == {}


def test_the_control_is_shown_beside_the_verdict_and_never_enters_it(tmp_path):
    control = [{**run(r, label, "control_pure_python", t), "kind": "pure-Python control"}
               for r, label, t in ((1, "py310", 2.0), (1, "py311", 1.0))]
    write_evidence(tmp_path, [*(r for r in RUNS if r["cell"] == "launch_x"), *control])
    result = pythonclaim.evaluate_claim(CLAIM, tmp_path)
    assert (result["verdict"], result["verdict_text"]) == ("holds", "holds")  # +100 % would exceed the band
    assert result["measured_text"].endswith(
        "[pure-Python control, not judged: +100.0 % (1 rounds); Python 3.11.7 vs 3.10.13, torch 2.13.0+cu130, CPU "
        "time per step, on the CPU (results-reference/python/e.json)]")
    elsewhere = tmp_path / "only-control"
    write_evidence(elsewhere, control)
    only = pythonclaim.evaluate_claim(CLAIM, elsewhere)
    assert only["verdict"] == "not_measurable" and only["reason"] == (
        "results-reference/python/e.json: no training-step cell, only the control; re-run tools/python_speed/run.sh")


def test_every_kind_in_the_band_holds(tmp_path):
    write_evidence(tmp_path, [r for r in RUNS if r["cell"] == "launch_x"])
    result = pythonclaim.evaluate_claim(CLAIM, tmp_path)
    assert (result["verdict"], result["verdict_text"]) == ("holds", "holds")


@pytest.mark.parametrize("content, message", [
    (None, "results-reference/python/e.json: no such evidence file. Fix: run tools/python_speed/run.sh"),
    ("{", "results-reference/python/e.json: not valid JSON"),
    (json.dumps({"runs": []}), "results-reference/python/e.json: no `runs` list"),
    (json.dumps({"runs": [{"round": 1}]}), "results-reference/python/e.json: a run lacks label, cell, kind, "
                                           "median_step_cpu_s"),
])
def test_bad_evidence_is_not_measurable_with_the_fix(tmp_path, content, message):
    if content is not None:
        (tmp_path / "results-reference" / "python").mkdir(parents=True)
        (tmp_path / "results-reference" / "python" / "e.json").write_text(content)
    result = pythonclaim.evaluate_claim(CLAIM, tmp_path)
    assert result["verdict"] == "not_measurable" and result["reason"].startswith(message)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.pop("evidence"), "claim field claims[0] (id 'py'): 'evidence' is a required property"),
    (lambda c: c.update(baseline="fp32"), "claim field claims[0] (id 'py').baseline: a python_speedup claim is "
                                          "judged from its evidence file (interpreters, not precisions, are compared); "
                                          "remove the field."),
    (lambda c: c.update(evidence="/etc/passwd"),
     "claim field claims[0] (id 'py').evidence: '/etc/passwd' does not match"),
    (lambda c: c.update(metric="speedup", baseline="fp32", variant="amp_fp16"),
     "claim field claims[0] (id 'py').evidence: only a python_speedup claim reads an evidence file, this one is "
     "speedup; remove the field."),
])
def test_the_claim_file_checks_the_python_fields(change, message):
    claim = copy.deepcopy(CLAIM)
    change(claim)
    with pytest.raises(claimfile.ClaimsError) as info:
        claimfile.validate({"claims": [claim]}, "c.yaml")
    assert message in str(info.value)
    assert claimfile.validate({"claims": [copy.deepcopy(CLAIM)]})[0]["metric"] == "python_speedup"


def test_the_committed_claim_is_judged_from_the_committed_evidence_on_any_run():
    claim = next(c for c in claimfile.load_claims(CLAIMS) if c.get("metric") == "python_speedup")
    evidence = json.loads((REPO / claim["evidence"]).read_text())
    assert set(evidence["interpreters"]) == {"py310", "py311"} and evidence["torch"]["threads"] == 1
    assert evidence["interpreters"]["py310"]["version"].startswith("3.10.")
    assert evidence["interpreters"]["py311"]["version"].startswith("3.11.")
    assert {c["kind"] for c in evidence["cells"]} == {"launch-bound", "compute-bound", pythonclaim.CONTROL_KIND}
    # the file's own summary is what its runs give
    assert evidence["cells"] == json.loads(json.dumps(pythonclaim.cell_summary(evidence["runs"])))
    result = claims.evaluate_claim(claim, {"cells": []})
    assert result["verdict"] != "not_measurable"
    assert result["measured_text"].startswith("launch-bound: ") and "; compute-bound: " in result["measured_text"]


def test_a_cpu_report_lists_the_evidence_claim_apart_from_the_claims_this_run_cannot_measure():
    summary = json.loads((SMOKE / "summary" / "summary.json").read_text())
    results = claims.evaluate_run(CLAIMS, summary, None, SMOKE / "runs")
    run_claims = [r for r in results if not r.get("evidence")]
    glance = reporthtml.glance_html({"summary": summary, "environment": {}, "sanity": {}, "apex": {},
                                     "claims": results})
    assert f"{len(run_claims)} from the articles, none measurable on this run (smoke preset on CPU)" in glance
    evidence_line = glance[glance.index("From committed evidence, not this run:"):]
    assert "<b>python311-training-step</b>" in evidence_line and "launch-bound: " in evidence_line
    detail = reporthtml.claims_detail_html(results)
    assert "Python 3.11 vs 3.10: the pipeline&#39;s FP32 training step on the CPU, from committed evidence" in detail


def test_the_python_axis_envs_differ_in_the_interpreter_only():
    py310, py311 = (yaml.safe_load((REPO / "envs" / "python" / f"train-{v}.yaml").read_text())
                    for v in ("py310", "py311"))
    assert py310["channels"] == py311["channels"] == ["conda-forge", "nodefaults"]
    assert [d for d in py310["dependencies"] if not d.startswith("python=")] == [
        d for d in py311["dependencies"] if not d.startswith("python=")]
    assert "python=3.10.20" in py310["dependencies"] and "python=3.11.15" in py311["dependencies"]
    train = yaml.safe_load((REPO / "envs" / "train.yaml").read_text())["dependencies"]
    assert "pytorch=2.13.0=cpu_*" in train and "pytorch=2.13.0=cpu_*" in py310["dependencies"]


def test_the_benchmark_times_the_pipelines_step_on_the_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tools" / "python_speed"))
    import bench
    import torch

    threads = torch.get_num_threads()
    try:
        out = bench.run_cell("launch_tiny_transformer", steps=5, warmup=1)
        control = bench.run_control(steps=5, warmup=1)
    finally:
        torch.set_num_threads(threads)  # the benchmark's one thread is not the rest of the session's
    assert out["kind"] == "launch-bound" and out["torch_threads"] == 1 and out["steps"] == 5
    assert 0 < out["min_step_s"] <= out["p10_step_s"] <= out["median_step_s"]
    assert 0 < out["p10_step_cpu_s"] <= out["median_step_cpu_s"]
    assert control["kind"] == pythonclaim.CONTROL_KIND and 0 < control["p10_step_cpu_s"] <= control["median_step_cpu_s"]
    assert out["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert 0 < out["last_loss"] < 5 and out["model_config"]["arch"] == "tiny_transformer"
