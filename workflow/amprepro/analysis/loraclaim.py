"""What a 12 GB card LoRA-fine-tunes, with AMP and without (issue 39; the second article's
"个人开发者在RTX 3060上尝试LLM微调"): a prediction from amprepro.memory, and a claim judged from the LoRA
cells that ran (config/presets/lora.yaml).

Two sides, each a LoRA fine-tune (amprepro.train.lora: rank-r adapters on every linear of the blocks, trained in FP32):
- AMP: the frozen base held in bf16, trained under bf16 autocast (the claim's variant, amp_bf16);
- FP32: the frozen base held in FP32, no autocast (the claim's baseline, fp32).

The prediction (predict): for a card of M bytes, each shape of amprepro.memory.LLAMA_LADDER at the claim's setting
(micro-batch, seq_len, rank, checkpointing), judged as the memory plan judges a cell (amprepro.plan.memplan): an
estimate up to FIT of M fits, up to PROBE_UP_TO it is a close call a probe would decide, above that it does not fit.

The judgement (judge): for a card of M bytes, a cell shows its shape LoRA-fine-tunes when it ran (status ok), its
allocator peak was within amprepro.memory.HEADROOM of M (the pipeline's own rule for a measured peak), and its loss
fell: the held-out loss after the last step at least LOSS_FALL below the one before the first step (the training
loss of the first step against the last where a cell has no held-out curve). It shows its shape does not fit when its
peak was over HEADROOM of M, or it was skipped for memory (out of memory, or refused by the plan: the plan's estimate,
a prediction, which the text says) under an allocator limit of at most M. Each side's answer is the largest shape
shown to fine-tune; it is "exact" where the next shape up the ladder was shown not to fit or there is none, "at
least" otherwise. The claim's question is M = lora.memory_gib (12); a run on a card with more memory (or at another
cap) also answers for its own memory, as context beside the verdict.

Verdict (the claim: claimed.at_least parameters with AMP): holds where the AMP side's answer at M has at least that
many parameters, falls short where it has fewer or no shape fine-tuned, not measurable where no AMP cell tells
(none ran; a CPU cell has no allocator peak; a cell skipped for memory under a limit above M says nothing about M).
Torch-free: the report and CI run it.
"""

from __future__ import annotations

from amprepro import memory
from amprepro.plan.memplan import FIT, PROBE_UP_TO

LOSS_FALL = 0.05  # the end loss at most 95 % of the start loss: "falls", beyond a few steps' noise
AMP, FP32 = "amp", "fp32"
SIDE_TEXT = {AMP: "with AMP (bf16 base, bf16 autocast)", FP32: "in FP32 (FP32 base, no autocast)"}


def shape_text(shape: str) -> str:
    parameters = memory.llama_parameters(memory.LLAMA_SHAPES[shape])[0]
    return f"{memory.LLAMA_NAMES.get(shape, shape)} ({parameters / 1e9:.2f} B)"


def ladder_rank(shape: str) -> int:
    """0 for the ladder's largest shape, 1 for the next, ...; shapes off the ladder (llama_tiny) after them."""
    keys = [key for key, _, _ in memory.LLAMA_LADDER]
    return keys.index(shape) if shape in keys else len(keys)


# ----------------------------------------------------------------------------------------------------------------------
# The prediction


def side_lora(side: str, setting: dict) -> tuple[str, memory.Lora]:
    """(precision, Lora) of a side at the claim's setting."""
    base = "bf16" if side == AMP else "fp32"
    return ("amp_bf16" if side == AMP else "fp32"), memory.Lora(rank=setting.get("rank", 16), base=base)


def predict(memory_bytes: int, setting: dict) -> dict:
    """Per side, every ladder shape's estimate and what the plan's rule makes of it at memory_bytes, and the largest
    that fits (None where none does)."""
    out = {}
    for side in (AMP, FP32):
        precision, lora = side_lora(side, setting)
        rows = []
        for key, name, shape in memory.LLAMA_LADDER:
            e = memory.llama_estimate(key, precision, setting.get("batch", 1), setting.get("seq_len", 512),
                                      setting.get("checkpointing", True), lora=lora)
            ratio = e.total / memory_bytes
            rows.append({"shape": key, "name": name, "parameters": memory.llama_parameters(shape)[0],
                         "estimate_bytes": e.total, "ratio": ratio,
                         "fits": "yes" if ratio <= FIT else "close" if ratio <= PROBE_UP_TO else "no"})
        largest = next((r for r in rows if r["fits"] == "yes"), None)
        out[side] = {"precision": precision, "lora": lora.text(), "shapes": rows,
                     "largest": largest["shape"] if largest else None}
    return out


def prediction_text(memory_bytes: int, setting: dict) -> str:
    p = predict(memory_bytes, setting)
    parts = []
    for side in (AMP, FP32):
        largest = p[side]["largest"]
        row = next((r for r in p[side]["shapes"] if r["shape"] == largest), None)
        up = next((r for r in reversed(p[side]["shapes"]) if ladder_rank(r["shape"]) == ladder_rank(largest) - 1),
                  None) if largest else None
        text = (f"{SIDE_TEXT[side]} up to {shape_text(largest)}, estimate {memory.gib(row['estimate_bytes'])}"
                if row else f"{SIDE_TEXT[side]} no ladder shape")
        if up:
            text += f" (next, {up['name']}: {memory.gib(up['estimate_bytes'])})"
        parts.append(text)
    recompute = "checkpointing per block" if setting.get("checkpointing", True) else "no checkpointing"
    return (f"predicted for {memory.gib(memory_bytes)} (micro-batch {setting.get('batch', 1)} x "
            f"{setting.get('seq_len', 512)} tokens, {recompute}, "
            f"LoRA r={setting.get('rank', 16)} on every linear; fits at most {FIT:.0%} of it): " + "; ".join(parts))


# ----------------------------------------------------------------------------------------------------------------------
# The judgement


def side_of(row: dict, claim: dict) -> str | None:
    """Which side a summary row is on: a LoRA cell of a ladder shape with a bf16 base under the claim's variant, or an
    FP32 base under one of its baselines; None for every other cell (llama_tiny's, the CPU tests' shape, too)."""
    if row.get("lora_shape") not in memory.LLAMA_NAMES:
        return None
    base = row.get("lora_base")
    if base == "bf16" and row["precision"] == claim["variant"]:
        return AMP
    if base == "fp32" and row["precision"] in claim["baseline"]:
        return FP32
    return None


def loss_fell(row: dict) -> tuple[bool | None, str]:
    start, end, what = row.get("heldout_loss_initial"), row.get("heldout_loss_final"), "held-out loss"
    if start is None or end is None:
        start, end, what = row.get("initial_loss"), row.get("final_loss"), "training loss"
    if start is None or end is None:
        return None, "no loss recorded"
    return end <= (1 - LOSS_FALL) * start, f"{what} {start:.2f} → {end:.2f}"


def cell_at(row: dict, memory_bytes: int) -> dict:
    """One cell read against a card of memory_bytes: fits (True), does not fit (False) or says nothing (None)."""
    shape = row["lora_shape"]  # the config's shape, or its arch's own (llama: LLaMA-7B)
    limit = row.get("memory_limit_bytes")
    out = {"model": row["model"], "shape": shape, "status": row["status"],
           "peak_bytes": row.get("peak_allocated_bytes"), "limit_bytes": limit}
    if row["status"] == "ok":
        peak = row.get("peak_allocated_bytes")
        fell, loss = loss_fell(row)
        out["loss"], out["loss_fell"] = loss, fell
        if peak is None:
            return {**out, "fits": None, "why": "ran without a GPU allocator peak (CPU)"}
        if not memory.within_headroom(peak, memory_bytes):
            return {**out, "fits": False, "why": f"peak {memory.gib(peak)} over {memory.HEADROOM:.0%} of "
                    f"{memory.gib(memory_bytes)}"}
        where = f"peak {memory.gib(peak)}" + (f" under a {memory.gib(limit)} allocator limit" if limit else "")
        return {**out, "fits": True, "why": f"{where}, {loss}" if fell else f"{where}, but its loss did not fall "
                f"({loss})"}
    if row.get("skip_needs") == "more GPU memory" and limit and limit <= memory_bytes:
        how = "refused by the memory plan (its estimate)" if "out of GPU memory" not in (row.get("reason") or "") \
            else "out of memory"
        return {**out, "fits": False, "why": f"{how} under {memory.gib(limit)}"}
    return {**out, "fits": None, "why": f"{row['status']}: {(row.get('reason') or '')[:160]}"}


def answer(rows: list[dict], memory_bytes: int) -> dict:
    """One side's answer for a card of memory_bytes from its cells (summary rows)."""
    cells = sorted((cell_at(r, memory_bytes) for r in rows), key=lambda c: ladder_rank(c["shape"]))
    fitting = [c for c in cells if c["fits"] is True and c.get("loss_fell")]
    if not fitting:
        told = [c for c in cells if c["fits"] is not None]  # ran within memory without a falling loss, or did not fit
        return {"largest": None, "exact": False, "cells": cells,
                "text": ("no shape shown to fine-tune: " + "; ".join(f"{shape_text(c['shape'])} {c['why']}"
                                                                     for c in told)) if told else None}
    best = fitting[0]
    rank = ladder_rank(best["shape"])
    above = [c for c in cells if ladder_rank(c["shape"]) == rank - 1 and c["fits"] is False]
    exact = rank == 0 or bool(above)
    text = ("up to " if exact else "up to at least ") + shape_text(best["shape"]) + f" ({best['why']})"
    if above:
        text += f"; {memory.LLAMA_NAMES.get(above[0]['shape'])} does not fit ({above[0]['why']})"
    elif rank == 0:
        text += "; the ladder's largest shape"
    return {"largest": best["shape"], "exact": exact, "cells": cells, "text": text}


def card_memory(summary: dict) -> int | None:
    """The memory this run's cells had: the emulated card's (gpu_memory_limit_gib) or the GPU's own."""
    versions = summary.get("versions") or {}
    if versions.get("gpu_memory_limit_gib"):
        return int(float(versions["gpu_memory_limit_gib"]) * memory.GIB)
    return versions.get("gpu_memory_bytes")


def judge(claim: dict, summary: dict) -> dict:
    """The claim's verdict and its texts (the keys amprepro.analysis.claims' results carry) and the details."""
    setting = claim["lora"]
    question = int(setting["memory_gib"] * memory.GIB)
    sides = {AMP: [], FP32: []}
    for row in summary.get("cells", []):
        side = side_of(row, claim)
        if side:
            sides[side].append(row)
    questions = [question]
    card = card_memory(summary)
    if card and card != question:
        questions.append(card)
    answers = {q: {side: answer(rows, q) for side, rows in sides.items()} for q in questions}
    at_question = answers[question]
    prediction = prediction_text(question, setting)
    detail = {"prediction": predict(question, setting), "prediction_text": prediction,
              "answers": [{"memory_bytes": q, **answers[q]} for q in questions]}

    def sentence(q: int) -> str:
        return f"{memory.gib(q)}: " + "; ".join(f"{SIDE_TEXT[s]} {answers[q][s]['text'] or 'not measured'}"
                                                 for s in (AMP, FP32))

    measured = " | ".join(sentence(q) for q in questions)
    amp = at_question[AMP]
    wanted = claim["claimed"]["at_least"]
    if amp["largest"] is None and amp["text"] is None:
        why = "no LoRA cell with a bf16 base under AMP tells what fits in " + memory.gib(question)
        ran = ", ".join(f"{c['model']} ({c['why']})" for c in amp["cells"]) or "none ran (config/presets/lora.yaml)"
        return {"verdict": "not_measurable", "reason": f"{why}: {ran}; {prediction}", "measured_text": "",
                "lora": detail, "needs": f"LoRA cells ({'/'.join(claim['models'])}), on a GPU (lora preset)"}
    parameters = memory.llama_parameters(memory.LLAMA_SHAPES[amp["largest"]])[0] if amp["largest"] else 0
    verdict = "holds" if parameters >= wanted else "falls_short"
    named = (f"with AMP a {setting['memory_gib']:g} GiB card LoRA-fine-tunes {short(amp)}; in FP32 "
             f"{short(at_question[FP32])}")
    if card and card != question:
        named += (f" (this card, {memory.gib(card)}: with AMP {short(answers[card][AMP])}; in FP32 "
                  f"{short(answers[card][FP32])})")
    return {"verdict": verdict, "measured_text": named, "reason": f"{measured}; {prediction}", "lora": detail}


def short(a: dict) -> str:
    """One side's answer in a few words: "up to OpenLLaMA-3B (3.43 B)", "up to at least ...", "no ladder shape"."""
    if a["largest"]:
        return ("up to " if a["exact"] else "up to at least ") + shape_text(a["largest"])
    return "no ladder shape" if a["text"] else "not measured"
