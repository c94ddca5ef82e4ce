"""The memory plan: before any cell runs, the batch (and for the 7B model the LLaMA shape) each model runs at on this
GPU, so that every precision of it fits and the precisions still compare at equal batch.

    python -m amprepro.plan.memplan --cells CELLS_JSON --device cuda|cpu [--limit-gib G] --out results/plan/plan.json
        --views results/plan/models

- Models are planned in groups: the models that share an arch, data and sizes (resnet50 and resnet50_channels_last,
  vit_b_16 and its optimizer and kernel variants) run at one batch, the smallest any of them needs, so variants
  compare at equal batch too.
- The preset's batch is an upper bound: the plan keeps it where every cell of the group fits, else steps down a ladder
  (multiples of 8 where the preset's batch is one, then 7 ... 1). A batch the user wrote in their own config is kept
  as written; a cell that cannot fit it is skipped, with both numbers.
- The 7B model (arch llama, no shape set) steps down amprepro.memory.LLAMA_LADDER, published LLaMA-family shapes, to
  the largest whose every precision fits at the preset's batch. A LoRA model (model_config lora) is planned the same
  way, in a group of its own, its estimate the LoRA one: the lora preset's question, the largest shape this card
  LoRA-fine-tunes.
- "Fits" is decided from amprepro.memory's estimate against the budget: the memory a cell's allocator may take (the
  card's free memory, or the emulated card's size minus what is already in use: gpu_memory_limit_gib). An estimate
  up to FIT fits; one up to PROBE_UP_TO is checked by a short probe (amprepro.plan.probe: a few real steps in a fresh
  or forked process, under the same cap), which decides (it fits when it ran with its allocator peak at most
  amprepro.memory.HEADROOM of the budget); above that it does not fit. The apex precisions cannot be
  probed here (apex is still being built), so they fit up to APEX_UNPROBED.
- Writes plan.json (everything: the card, the budget, each cell's estimate and the decision, every probe, the seconds)
  and one view per model (results/plan/models/<model>.json: what its cells read, whose bytes change only when that
  model's plan does, so a re-plan with the same outcome re-runs no cell).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from amprepro import archs, memory, precisions
from amprepro.cellspec import CellSpec
from amprepro.files import write_json

FIT = 0.85
PROBE_UP_TO = 1.02
APEX_UNPROBED = 0.95
MAX_PROBES_PER_GROUP = 3
PROBE_SECONDS = 40  # all probes of one plan: past this, a close call is taken as not fitting (and the plan says so)


def group_key(spec: CellSpec) -> str:
    """Models whose cells share a memory profile: arch, data, sizes (defaults filled in) and the preset's batch."""
    s = spec.settings
    image = s.image_size if s.data == "synthetic_images" else None
    tokens = (s.seq_len or archs.SYNTHETIC_TOKENS_SEQ_LEN) if s.data == "synthetic_tokens" else None
    lora = [s.lora.as_dict()] if s.lora is not None else []  # a LoRA model (its base, its adapters) is its own group
    return json.dumps([s.arch, s.data, image, tokens, s.activation_checkpointing, s.batch_size, s.gpus, s.shape,
                       *lora], sort_keys=True)


def ladder(preset_batch: int) -> list[int]:
    """The batches to try, largest first."""
    if preset_batch % 8 == 0:
        return [*range(preset_batch, 0, -8), *range(min(7, preset_batch - 1), 0, -1)]
    return list(range(preset_batch, 0, -1))


def shapes_to_try(spec: CellSpec, source: str) -> list[str | None]:
    """None (the model as configured), or the LLaMA ladder from the 7B shape down for the preset's 7B model."""
    ladder = archs.get(spec.arch).ladder
    if ladder and not spec.settings.shape and source == "preset":
        return [key for key, _, _ in ladder]
    return [spec.settings.shape]


class Planner:
    """Decides each group's batch and shape. budget: bytes a cell's allocator may take (None: no GPU, no limit);
    probe(spec) -> dict runs a short real cell and returns its record (status, peak_allocated_bytes)."""

    def __init__(self, budget: int | None, probe=None, probe_seconds: float = PROBE_SECONDS):
        self.budget, self.probe_fn, self.probe_seconds = budget, probe, probe_seconds
        self.probes: list[dict] = []
        self.probe_time = 0.0

    def judge(self, spec: CellSpec) -> dict:
        """One cell at its (planned) batch and shape: the estimate, its ratio to the budget, what it means."""
        e = memory.estimate(spec.model_config, spec.precision, spec.optimizer)
        out = {"model": spec.model, "precision": spec.precision, "batch_size": memory.cell_batch(spec.settings),
               "estimate": e.as_record()}
        if self.budget is None:
            return {**out, "ratio": None, "decision": "fits", "how": "no GPU memory limit here"}
        ratio = e.total / self.budget
        out["ratio"] = ratio
        if ratio <= FIT:
            return {**out, "decision": "fits", "how": f"estimate {ratio:.0%} of the budget (<= {FIT:.0%})"}
        if precisions.get(spec.precision).needs_apex:
            if ratio <= APEX_UNPROBED:
                return {**out, "decision": "fits", "how": f"estimate {ratio:.0%} of the budget (<= "
                        f"{APEX_UNPROBED:.0%}; apex cells are not probed: apex is built beside the plan)"}
            return {**out, "decision": "does not fit", "how": f"estimate {ratio:.0%} of the budget (> "
                    f"{APEX_UNPROBED:.0%}, the most an unprobed apex cell may take)"}
        if ratio <= PROBE_UP_TO and self.probe_fn is not None:
            return {**out, "decision": "probe", "how": f"estimate {ratio:.0%} of the budget: close, probed"}
        return {**out, "decision": "does not fit", "how": f"estimate {ratio:.0%} of the budget (> "
                f"{PROBE_UP_TO:.0%})" if ratio > PROBE_UP_TO else f"estimate {ratio:.0%} of the budget and no probe "
                "here"}

    def run_probe(self, spec: CellSpec, judged: dict, group_probes: list) -> bool:
        if len(group_probes) >= MAX_PROBES_PER_GROUP or self.probe_time >= self.probe_seconds:
            judged.update(decision="does not fit", how=judged["how"] + "; probe budget spent (taken as not fitting)")
            return False
        started = time.monotonic()
        record = self.probe_fn(spec)
        seconds = time.monotonic() - started
        self.probe_time += seconds
        ran = record.get("status") == "ok"
        ok = ran and memory.within_headroom(record.get("peak_allocated_bytes"), self.budget)
        probe = {"model": spec.model, "precision": spec.precision, "batch_size": judged["batch_size"],
                 "shape": spec.settings.shape, "status": record.get("status"),
                 "peak_allocated_bytes": record.get("peak_allocated_bytes"),
                 "peak_reserved_bytes": record.get("peak_reserved_bytes"), "reason": record.get("reason", ""),
                 "estimate_bytes": judged["estimate"]["total_bytes"], "seconds": round(seconds, 2)}
        self.probes.append(probe)
        group_probes.append(probe)
        judged["probe"] = probe
        judged["decision"] = "fits" if ok else "does not fit"
        peak = memory.gib(probe["peak_allocated_bytes"])
        judged["how"] += (f": ran, peak {peak}" if ok else
                          f": ran, but its peak {peak} is over {memory.HEADROOM:.0%} of the budget (no headroom)" if ran
                          else f": {record.get('status')} ({(record.get('reason') or '')[:120]})")
        return ok

    def fits(self, specs: list[CellSpec], group_probes: list) -> tuple[bool, list[dict]]:
        judged = [self.judge(s) for s in specs]
        if any(j["decision"] == "does not fit" for j in judged):
            return False, judged
        close = sorted((j for j in judged if j["decision"] == "probe"), key=lambda j: -j["ratio"])
        if close:  # the worst close cell decides for the rest: its estimate is the largest
            worst = close[0]
            spec = next(s for s in specs if s.precision == worst["precision"] and s.model == worst["model"])
            ok = self.run_probe(spec, worst, group_probes)
            for j in close[1:]:
                j.update(decision=worst["decision"], how=j["how"] + f"; decided by the probe of {worst['precision']}")
            return ok, judged
        return True, judged

    def plan_group(self, specs: list[CellSpec], source: str) -> dict:
        first = specs[0]
        shapes = shapes_to_try(first, source)
        # A LLaMA ladder keeps the preset's batch and steps down the shapes; any other model steps down the batches.
        batches = [first.batch_size] if source == "config" or len(shapes) > 1 else ladder(first.batch_size)
        group_probes: list = []
        tried = []
        for shape in shapes:
            effective = None if shape == first.arch else shape  # the 7B shape is the arch itself: the spec unchanged
            for batch in batches:
                candidate = [s.planned({"batch_size": batch, "shape": effective}) for s in specs]
                ok, judged = self.fits(candidate, group_probes)
                tried.append({"batch_size": batch, "shape": effective, "fits": ok, "cells": judged})
                if ok:
                    return self.decision(first, batch, effective, source, tried, fits=True)
        return self.decision(first, batches[0], first.settings.shape, source, tried, fits=False)

    def decision(self, first: CellSpec, batch: int, shape, source: str, tried: list, fits: bool) -> dict:
        preset_batch = first.batch_size
        worst = max(tried[-1]["cells"], key=lambda j: j["estimate"]["total_bytes"])
        limit = memory.gib(self.budget)
        if not fits:
            why = (f"does not fit: {worst['model']}/{worst['precision']} at batch {batch} {worst['how']}; "
                   f"{memory.describe_record(worst['estimate'])} against {limit} here"
                   + ("; the batch is the config's, kept as written" if source == "config" else
                      "; no batch of the ladder fits"))
        elif shape and shape != first.settings.shape:
            parameters = memory.llama_parameters(memory.LLAMA_SHAPES[shape])[0]
            why = (f"{memory.LLAMA_NAMES[shape]} shape ({parameters / 1e9:.2f} B "
                   f"parameters), the largest LLaMA-family shape of the ladder whose every precision fits in {limit}")
        elif self.budget is None:
            why = f"the {'config' if source == 'config' else 'preset'}'s batch {batch}: no GPU here, nothing to fit"
        elif batch == preset_batch:
            why = (f"the {'config' if source == 'config' else 'preset'}'s batch {batch}: every precision fits"
                   + (f" in {limit}" if self.budget is not None and source == "config" else ""))
        else:
            why = (f"{batch} of the preset's {preset_batch}: the largest at which {worst['model']}/"
                   f"{precisions.label(worst['precision'])} fits in {limit}")
        return {"batch_size": batch, "preset_batch_size": preset_batch, "shape": shape,
                "shape_name": memory.LLAMA_NAMES.get(shape) if shape else None, "fits": fits, "why": why,
                "source": source, "tried": tried}


# ----------------------------------------------------------------------------------------------------------------------
# The card


def card(device: str, limit_gib: float | None) -> dict:
    """What the plan and the cells may use: the GPU's total and free memory, the cap, and the allocator limit the
    cells apply (torch.cuda.set_per_process_memory_fraction) when a cap is set."""
    if device != "cuda":
        return {"device": "cpu", "budget_bytes": None, "allocator_limit_bytes": None, "cap_gib": limit_gib,
                "note": "no GPU: the presets' batches are kept"}
    import torch

    if not torch.cuda.is_available():  # a job the scheduler gave GPUs that CUDA cannot see: the cells will say so
        return {"device": "cpu", "budget_bytes": None, "allocator_limit_bytes": None, "cap_gib": limit_gib,
                "note": "GPU jobs, but torch sees no CUDA device in the plan's job: the presets' batches are kept"}
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    in_use = total - free  # this process's CUDA context and anything another process holds
    record = {"device": "cuda", "gpu": props.name, "total_bytes": total, "free_bytes": free, "in_use_bytes": in_use,
              "cap_gib": limit_gib, "allocator_limit_bytes": None, "budget_bytes": free}
    if limit_gib is not None:
        cap = int(limit_gib * memory.GIB)
        if cap >= total:
            record["note"] = (f"gpu_memory_limit_gib {limit_gib} is not below this card's {memory.gib(total)}: "
                              "no cap applied")
        else:
            limit = max(cap - in_use, 0)
            record.update(allocator_limit_bytes=limit, budget_bytes=min(limit, free),
                          note=f"emulating a {limit_gib:g} GiB card: {memory.gib(cap)} less the "
                               f"{memory.gib(in_use)} already in use (the CUDA context)")
    return record


def view(model: str, decision: dict, machine: dict) -> dict:
    """What one model's cells read: stable bytes (no free-memory figure unless it decided something)."""
    return {"model": model, "batch_size": decision["batch_size"], "preset_batch_size": decision["preset_batch_size"],
            "shape": decision["shape"], "shape_name": decision["shape_name"], "fits": decision["fits"],
            "why": decision["why"], "source": decision["source"], "cap_gib": machine.get("cap_gib"),
            "allocator_limit_bytes": machine.get("allocator_limit_bytes")}


def make_plan(cells: list[dict], machine: dict, probe=None) -> dict:
    started = time.monotonic()
    specs = [CellSpec.of(c["spec"]) for c in cells]
    sources = {c["spec"]["model"]: c.get("batch_source", "preset") for c in cells}
    groups: dict[str, list[CellSpec]] = {}
    for spec in specs:
        groups.setdefault(group_key(spec) + "/" + sources[spec.model], []).append(spec)
    planner = Planner(machine["budget_bytes"], probe if machine["device"] == "cuda" else None)
    decisions, models = [], {}
    for members in groups.values():
        decision = planner.plan_group(members, sources[members[0].model])
        decision["models"] = sorted({s.model for s in members})
        decisions.append(decision)
        for model in decision["models"]:
            models[model] = view(model, decision, machine)
    return {"machine": machine, "margins": {"fit": FIT, "probe_up_to": PROBE_UP_TO, "apex_unprobed": APEX_UNPROBED,
                                            "probe_headroom": memory.HEADROOM},
            "groups": decisions, "models": models, "probes": planner.probes,
            "probe_seconds": round(planner.probe_time, 2), "seconds": round(time.monotonic() - started, 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", required=True, help="JSON list of {spec, batch_source}")
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--limit-gib", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1, help="each probe's threads (the job's)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--views", required=True, help="folder for one <model>.json per model")
    args = parser.parse_args(argv)
    started = time.monotonic()
    cells = json.loads(args.cells)
    machine = card(args.device, args.limit_gib)
    from amprepro.plan import probe

    plan = make_plan(cells, machine, probe.Prober(Path(args.out).parent / "probes", machine, args.threads).run)
    plan["seconds_total"] = round(time.monotonic() - started, 2)
    for model, model_view in plan["models"].items():
        write_json(Path(args.views) / f"{model}.json", model_view)
    write_json(args.out, plan)
    for decision in plan["groups"]:
        print(f"plan: {', '.join(decision['models'])}: batch {decision['batch_size']}"
              + (f", shape {decision['shape_name']}" if decision["shape_name"] else "") + f": {decision['why']}")
    print(f"plan: {len(plan['probes'])} probe(s), {plan['probe_seconds']} s; {plan['seconds_total']} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
