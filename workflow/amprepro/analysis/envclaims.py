"""Claims about the environment, not about a precision (issue 38), judged from pairs of cells that differ in one
environment setting. config/claims.yaml marks them with `judge: {kind: ...}`; amprepro.analysis.claims hands them here.

- ``apex_shell``: "apex without its CUDA extensions gives no speed-up". Each cell of a model built on the empty shell
  (`apex_build: shell`: apex installed without --cpp_ext/--cuda_ext) against its full-build twin's strict FP32 and
  TF32 cells (the claim's baselines): the speedup is judged against the claim's band; what the shell costs against the
  full build's cell of the same precision (speed and memory) is stated beside it. The shell's skipped cells (FusedAdam,
  FusedLayerNorm: apex's own error) are named.
- ``environment``: "同样的模型，在不同开发环境中运行，显存占用可能相差 40%，训练速度波动可达两倍以上" (the same
  model in different environments: memory may differ by 40 %, speed by 2x or more). Per architecture, among the
  pairs of cells that differ only in environment settings (ENV_SETTINGS), the largest memory difference (larger peak
  over smaller, minus 1) and the largest speed ratio (faster over slower), each judged against its own band (the
  claim's `claimed`/`tolerance` for the speed, `judge.memory`/`judge.memory_tolerance` for the memory), naming the
  setting of the pair. The verdict per architecture is the worse of the two.

A pair compares like with like: same architecture, seed and batch (after the memory plan), both cells ok, the GPU
allocator peak recorded (a CPU's RSS is not what the claims mean). The model settings come from the cells' own
metrics.json (`specs`: model -> its spec, claims.evaluate_run reads them).
"""

from __future__ import annotations

from amprepro.analysis.claimmetrics import claimed_band, claimed_text, fmt_value, verdict_for
from amprepro.cellspec import CellSpec
from amprepro.modelsettings import MATRIX_KEYS, ModelSettings

# model_config keys and precision pairs that are environment, not algorithm: the same model and numerics target, set
# up differently. The value names the setting in the report.
ENV_SETTINGS = {"channels_last": "channels_last", "compile": "torch.compile vs eager",
                "fused_layer_norm": "apex FusedLayerNorm vs nn.LayerNorm",
                "apex_build": "the apex shell vs the full build"}
ENV_PRECISIONS = {frozenset({"fp32", "tf32"}): "TF32 on vs off",
                  frozenset({"amp_bf16", "amp_bf16_compile"}): "torch.compile vs eager"}
ENV_OPTIMIZERS = {"adamw", "adamw_fused", "apex_fused_adam"}  # the same AdamW update, fused or not
# How long a cell is measured (the median step time and the peak do not depend on the step count): not settings of
# the cell. What a model entry lists (its cells: amprepro.modelsettings.MATRIX_KEYS) is not either.
MEASUREMENT_KEYS = {"steps", "warmup_steps"}
VERDICT_TEXT = {"holds": "holds", "exceeds": "exceeds the claim", "falls_short": "falls short",
                "not_measurable": "not measurable here"}
WORST_FIRST = ["falls_short", "exceeds", "holds"]


def setup(spec: dict, precision: str) -> tuple[dict, str, dict]:
    """(model settings with defaults filled in, the cell's optimizer, the other train settings) of one cell."""
    written = {k: v for k, v in (spec.get("model_config") or {}).items() if k not in MATRIX_KEYS}
    cell = CellSpec.of({**spec, "precision": precision, "model_config": written})
    config = cell.settings.resolved()  # every setting, defaults filled in (amprepro.modelsettings)
    train = {k: v for k, v in cell.train.items() if k not in MEASUREMENT_KEYS | {"optimizer", "apex_optimizer"}}
    return config, cell.optimizer, train


def _settings(specs: dict, model: str) -> ModelSettings:
    """A model's settings from its spec (its model_config; a model entry's precisions and seeds left out)."""
    return ModelSettings.of_entry((specs.get(model) or {}).get("model_config") or {})


def environment_difference(a: tuple[str, str], b: tuple[str, str], specs: dict) -> str | None:
    """The environment settings two cells (model, precision) differ in, named; None when they differ in anything else
    (or in nothing)."""
    if a[0] not in specs or b[0] not in specs:
        return None
    (config_a, opt_a, train_a), (config_b, opt_b, train_b) = setup(specs[a[0]], a[1]), setup(specs[b[0]], b[1])
    if train_a != train_b:
        return None
    names = []
    if a[1] != b[1]:
        if frozenset({a[1], b[1]}) not in ENV_PRECISIONS:
            return None
        names.append(ENV_PRECISIONS[frozenset({a[1], b[1]})])
    for key in sorted(set(config_a) | set(config_b)):
        if config_a.get(key) != config_b.get(key):
            if key not in ENV_SETTINGS:
                return None
            names.append(ENV_SETTINGS[key])
    if opt_a != opt_b:
        if not {opt_a, opt_b} <= ENV_OPTIMIZERS:
            return None
        names.append(f"optimizer {opt_a} vs {opt_b}")
    return " and ".join(names) or None


def _context(summary: dict) -> str:
    preset = summary.get("preset", {}).get("preset", "?")
    return f"{preset} preset on {summary.get('versions', {}).get('gpu') or 'CPU'}"


def _arch_models(claim: dict, summary: dict, specs: dict) -> dict[str, list[str]]:
    """The claim's architectures (its `models`, matched by model name or arch) -> the models of that arch here."""
    present = list(dict.fromkeys(c["model"] for c in summary.get("cells", [])))
    wanted = {m.lower() for m in claim["models"]}
    groups: dict[str, list[str]] = {}
    for model in present:
        arch = str(_settings(specs, model).arch or model)
        if arch.lower() in wanted or model.lower() in wanted:
            groups.setdefault(arch, []).append(model)
    return groups


def _ok_gpu(row: dict | None) -> bool:
    return bool(row and row["status"] == "ok" and row.get("throughput_per_s") and row.get("peak_allocated_bytes"))


def _base(claim: dict, **fields) -> dict:
    return {"id": claim["id"], "statement": claim["statement"], "model": claim["model"], "models": claim["models"],
            "metric": claim.get("metric", "speedup"), "claimed": claim["claimed"], "tolerance": claim["tolerance"],
            "claimed_text": claimed_text({**claim, "metric": claim.get("metric", "speedup")}),
            "source": claim["source"], "note": claim.get("note", ""), "caveats": claim.get("caveats", []),
            "by_baseline": {}, "matched_models": [], **fields}


def _not_measurable(result: dict, reason: str) -> dict:
    return {**result, "verdict": "not_measurable", "verdict_text": VERDICT_TEXT["not_measurable"], "reason": reason,
            "measured_text": ""}


def _missing(claim: dict, summary: dict, what: str) -> str:
    here = ", ".join(dict.fromkeys(c["model"] for c in summary.get("cells", []))) or "none"
    return f"no {what} cell ran ({'/'.join(claim['models'])}): {_context(summary)} (models here: {here})"


def _worst(verdicts) -> str:
    verdicts = set(verdicts)
    return next(v for v in WORST_FIRST if v in verdicts)


def _pct(value: float) -> str:
    return f"{value * 100:+.1f} %".replace("-", "−")


# ----------------------------------------------------------------------------------------------------------------------
# "apex without its CUDA extensions gives no speed-up"


def full_twin(shell_model: str, models: list[str], specs: dict) -> str | None:
    """The model whose cells differ from the shell model's only in apex_build (vit_b_16 for vit_b_16_apex_shell)."""
    for model in models:
        if model != shell_model and environment_difference((shell_model, "apex_o1"), (model, "apex_o1"),
                                                           specs) == ENV_SETTINGS["apex_build"]:
            return model
    return None


def judge_shell(claim: dict, summary: dict, specs: dict) -> dict:
    result = _base(claim, variant="apex on the empty shell (apex_build: shell)", baselines=claim["baseline"])
    cells = {(c["model"], c["precision"], int(c["seed"])): c for c in summary.get("cells", [])}
    groups = _arch_models(claim, summary, specs)
    shells = {arch: [m for m in models if m in specs and _settings(specs, m).apex_build == "shell"]
              for arch, models in groups.items()}
    result["matched_models"] = [m for models in shells.values() for m in models]
    if not result["matched_models"]:
        return _not_measurable(result, _missing(claim, summary, f"{claim['model']} apex shell (apex_build: shell)"))
    skipped = [c for c in summary["cells"] if c["model"] in result["matched_models"] and c["status"] != "ok"]
    for baseline in claim["baseline"]:
        per_cell = {}
        for arch, shell_models in shells.items():
            for shell in shell_models:
                twin = full_twin(shell, groups[arch], specs)
                for (model, precision, seed), row in sorted(cells.items()):
                    if model == shell and row["status"] == "ok":
                        base = twin and cells.get((twin, baseline, seed))
                        full = twin and cells.get((twin, precision, seed))
                        name = f"{shell}/{precision}" + (f" seed {seed}" if seed else "")
                        per_cell[name] = shell_cell(claim, row, base, full, twin, baseline)
        judged = [r for r in per_cell.values() if r["verdict"] != "not_measurable"]
        reason = "; ".join(r["reason"] for r in per_cell.values()) or "no shell cell ran ok"
        result["by_baseline"][baseline] = {"verdict": _worst(r["verdict"] for r in judged) if judged
                                           else "not_measurable", "reason": reason, "models": per_cell}
    measured = {b: r for b, r in result["by_baseline"].items() if r["verdict"] != "not_measurable"}
    not_run = "; ".join(f"{c['model']}/{c['precision']} {c['status']}: {c.get('reason') or 'no reason'}"
                        for c in skipped)
    if not measured:
        reasons = "; ".join(dict.fromkeys(r["reason"] for r in result["by_baseline"].values()))
        return _not_measurable(result, reasons + (f"; {not_run}" if not_run else ""))
    verdicts = {r["verdict"] for r in measured.values()}
    verdict = verdicts.pop() if len(verdicts) == 1 else "depends_on_baseline"
    text = ("; ".join(f"{VERDICT_TEXT[r['verdict']]} vs {label(b)}" for b, r in measured.items())
            if verdict == "depends_on_baseline" else f"{VERDICT_TEXT[verdict]} vs "
            + " and ".join(label(b) for b in measured))
    result.update(verdict=verdict, verdict_text=text)
    result["reason"] = " | ".join(f"vs {label(b)}: {r['reason']}" for b, r in result["by_baseline"].items())
    result["measured_text"] = "; ".join(f"vs {label(b)}: " + ", ".join(
        f"{name} {r.get('measured_text') or 'n/a'}" for name, r in b_result["models"].items())
        for b, b_result in result["by_baseline"].items())
    if not_run:
        result["reason"] += f" | not run in the shell: {not_run}"
        result["measured_text"] += f"; not run in the shell: {not_run}"
    return result


def shell_cell(claim: dict, row: dict, base: dict | None, full: dict | None, twin: str | None, baseline: str) -> dict:
    """One shell cell against its twin's baseline cell, and against the twin's full-build cell of its precision."""
    name = f"{row['model']}/{row['precision']}"
    out = {"model": name, "verdict": "not_measurable", "borderline": False}
    if twin is None:
        return {**out, "reason": f"{name}: no model here differs from {row['model']} only in apex_build"}
    if not _ok_gpu(base) or not _ok_gpu(row):
        why = "no GPU allocator peak or throughput" if base and base["status"] == "ok" else \
            f"{twin}/{baseline} {base['status'] if base else 'did not run'}"
        return {**out, "reason": f"{name}: {why}"}
    speedup = row["throughput_per_s"] / base["throughput_per_s"]
    memory = row["peak_allocated_bytes"] / base["peak_allocated_bytes"] - 1
    verdict = verdict_for({**claim, "metric": "speedup"}, speedup)
    if verdict == "exceeds":  # faster than "no speed-up" allows: the article's warning does not hold for this cell.
        verdict = "falls_short"  # (For a speedup claim above its band is "exceeds the claim"; here it refutes it.)
    text = f"{fmt_value('speedup', speedup)}, memory {_pct(memory)} vs {twin}/{baseline}"
    if _ok_gpu(full):
        cost_speed = row["throughput_per_s"] / full["throughput_per_s"]
        cost_memory = row["peak_allocated_bytes"] / full["peak_allocated_bytes"] - 1
        text += (f"; against the full build's {twin}/{row['precision']}: {fmt_value('speedup', cost_speed)} its "
                 f"speed, memory {_pct(cost_memory)}")
        out["vs_full"] = {"speed_ratio": cost_speed, "memory_change": cost_memory}
    else:
        text += f"; the full build's {twin}/{row['precision']} did not run ok here"
    fused = row.get("apex_fused_kernels")
    # median/min/max of the one seed: the report's claims chart draws it against the band
    return {**out, "verdict": verdict, "value": speedup, "median": speedup, "min": speedup, "max": speedup,
            "n_seeds": 1, "memory_change": memory, "measured_text": text,
            "reason": f"{name}: {text}" + ("" if fused is None else f" (apex fused kernels: {fused})")}


def label(name: str) -> str:
    from amprepro import precisions

    return precisions.label(name) if name in precisions.REGISTRY else name


# ----------------------------------------------------------------------------------------------------------------------
# "the environment decides": memory up to 40 %, speed 2x or more


def env_pairs(rows: list[dict], specs: dict) -> list[tuple[str, dict, dict]]:
    """(setting, a, b) for each pair of ok GPU cells of one architecture that differ only in environment settings."""
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a["seed"] != b["seed"] or a.get("batch_size") != b.get("batch_size") or not (_ok_gpu(a) and _ok_gpu(b)):
                continue
            setting = environment_difference((a["model"], a["precision"]), (b["model"], b["precision"]), specs)
            if setting:
                pairs.append((setting, a, b))
    return pairs


def judge_environment(claim: dict, summary: dict, specs: dict) -> dict:
    memory_claim = {"claimed": claim["judge"]["memory"], "tolerance": claim["judge"].get("memory_tolerance", 0.0),
                    "metric": "memory_reduction"}
    speed_claim = {**claim, "metric": "speedup"}
    result = _base(claim, variant="cells that differ only in environment settings", baselines=[],
                   claimed_text=f"memory {gap_text(memory_claim)}; speed {claimed_text(speed_claim)}")
    groups = _arch_models(claim, summary, specs)
    result["matched_models"] = [m for models in groups.values() for m in models]
    if not groups:
        return _not_measurable(result, _missing(claim, summary, claim["model"]))
    per_arch = {}
    for arch, models in groups.items():
        rows = [c for c in summary["cells"] if c["model"] in models]
        pairs = env_pairs(rows, specs)
        if not pairs:
            per_arch[arch] = {"model": arch, "verdict": "not_measurable", "borderline": False,
                              "reason": f"{arch}: no two cells that differ only in environment settings ran ok on a "
                                        f"GPU ({_context(summary)}; cells here: {len(rows)})"}
            continue
        memory = max(pairs, key=lambda p: _memory_gap(p[1], p[2]))
        speed = max(pairs, key=lambda p: _speed_gap(p[1], p[2]))
        gap_memory, gap_speed = _memory_gap(memory[1], memory[2]), _speed_gap(speed[1], speed[2])
        verdicts = {"memory": verdict_for(memory_claim, gap_memory), "speed": verdict_for(speed_claim, gap_speed)}
        text = (f"memory differs by up to {gap_memory * 100:.1f} % ({memory[0]}: {_pair(memory, 'peak')}), speed by "
                f"up to {gap_speed:.2f}× ({speed[0]}: {_pair(speed, 'speed')}); {len(pairs)} pairs")
        side = ", ".join(f"{part} {VERDICT_TEXT[v]}" for part, v in verdicts.items())
        per_arch[arch] = {"model": arch, "verdict": _worst(verdicts.values()), "borderline": False,
                          "memory": {"value": gap_memory, "setting": memory[0]},
                          "speed": {"value": gap_speed, "setting": speed[0]},
                          "measured_text": text, "reason": f"{arch}: {text} ({side})"}
    judged = [r for r in per_arch.values() if r["verdict"] != "not_measurable"]
    reason = "; ".join(r["reason"] for r in per_arch.values())
    result["by_baseline"]["environment pairs"] = {"verdict": _worst(r["verdict"] for r in judged) if judged else
                                                  "not_measurable", "reason": reason, "models": per_arch}
    if not judged:
        return _not_measurable(result, reason)
    verdict = _worst(r["verdict"] for r in judged)
    return {**result, "verdict": verdict, "verdict_text": VERDICT_TEXT[verdict], "reason": reason,
            "measured_text": "; ".join(f"{r['model']}: {r['measured_text']}" for r in judged)}


def gap_text(memory_claim: dict) -> str:
    """The memory band as a difference ('at least 40 % (accepted from 36 %)'): claimed_text would write a saving."""
    low, high = claimed_band(memory_claim)
    (kind, value), = memory_claim["claimed"].items()
    if kind != "at_least":
        return f"{kind} {value} (accepted {low:.0%} to {high:.0%})"
    return f"at least {value * 100:.0f} % (accepted from {low * 100:.0f} %)"


def _memory_gap(a: dict, b: dict) -> float:
    low, high = sorted((a["peak_allocated_bytes"], b["peak_allocated_bytes"]))
    return high / low - 1


def _speed_gap(a: dict, b: dict) -> float:
    low, high = sorted((a["throughput_per_s"], b["throughput_per_s"]))
    return high / low


def _pair(pair: tuple[str, dict, dict], what: str) -> str:
    """'vit_b_16/fp32 over vit_b_16/tf32': the larger peak (or the faster cell) first."""
    key = "peak_allocated_bytes" if what == "peak" else "throughput_per_s"
    high, low = sorted(pair[1:], key=lambda r: r[key], reverse=True)
    return f"{high['model']}/{high['precision']} over {low['model']}/{low['precision']}"


JUDGES = {"apex_shell": judge_shell, "environment": judge_environment}


def judge(claim: dict, summary: dict, specs: dict | None) -> dict:
    """The verdict of a `judge:` claim, in the form amprepro.analysis.claims gives every claim."""
    return JUDGES[claim["judge"]["kind"]](claim, summary, specs or {})
