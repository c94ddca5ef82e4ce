"""Does a CPU-heavy job beside a timed cell slow the cell, and does the apex build's CPU share
(amprepro.env.cpushare) stop that? One device call, about a minute:

    python3 tools/gpu/cpu_share_probe.py --out $OUT/cpu_share_probe.json

A ViT-B/16-sized encoder (12 layers, width 768, 197 tokens, batch 64, bf16 autocast, foreach AdamW; its steps are
tens of milliseconds, like vit_timm's, so the host's launch thread matters) is timed with CUDA events, three rounds
of 20 steps after 5 warm-up steps, in each setting, the settings interleaved round by round (about a minute):
  quiet      nothing beside it
  beside     one busy process per usable CPU, anywhere, at normal priority (the build before cpushare)
  confined   the same processes, confined to the apex build's share (resources.apex_build_threads) at niceness 10
  confined_cell_pinned  as confined, and the timed process pinned to the other CPUs (would pinning the cells help?)
  confined_quarter      the same processes on a quarter of the CPUs (does what is left scale with the build's CPUs?)
The busy processes are pure-Python loops: a stand-in for nvcc and cicc, lighter on caches and memory than they are,
so this tests the scheduling part of the interference, not all of it.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))
from amprepro.env import cpushare
from amprepro.plan import resources


def spin(cpus, niceness):
    if cpus:
        os.sched_setaffinity(0, cpus)
    if niceness:
        os.nice(niceness)
    x = 1
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def settings_for(usable: list[int], siblings: dict) -> dict:
    """Each setting: None (quiet), or (the busy processes' CPUs or None for anywhere, their niceness, the timed
    process's own CPUs or None for anywhere). One busy process per usable CPU in every loaded setting."""
    share = cpushare.plan_share(usable, siblings, resources.apex_build_threads(len(usable), 1))  # the build's share
    quarter = cpushare.plan_share(usable, siblings, max(1, len(usable) // 4))
    rest = sorted(set(usable) - set(share)) if share else None
    return {"quiet": None, "beside": (None, 0, None), "confined": (share, cpushare.NICENESS, None),
            "confined_cell_pinned": (share, cpushare.NICENESS, rest),
            "confined_quarter": (quarter, cpushare.NICENESS, None)}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    import torch

    usable = cpushare.usable_cpus()
    siblings = cpushare.read_siblings()
    settings = settings_for(usable, siblings)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, norm_first=True)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randn(64, 197, 768, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, load in settings.items():
            procs = []
            if load is not None:
                procs = [mp.Process(target=spin, args=load[:2], daemon=True) for _ in usable]
                for p in procs:
                    p.start()
                if load[2]:
                    os.sched_setaffinity(0, load[2])
                time.sleep(0.5)
            step()
            torch.cuda.synchronize()
            events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
            events[0].record()
            for i in range(args.steps):
                step()
                events[i + 1].record()
            torch.cuda.synchronize()
            times[name] += [events[i].elapsed_time(events[i + 1]) for i in range(args.steps)]
            for p in procs:
                p.kill()
            for p in procs:
                p.join()
            os.sched_setaffinity(0, usable)
    result = {
        "what": "median step ms of a ViT-B/16-sized encoder under each CPU setting (tools/gpu/cpu_share_probe.py)",
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "usable_cpus": usable,
        "siblings": {str(k): sorted(v) for k, v in sorted(siblings.items())},
        "settings": {k: v and {"busy_cpus": v[0], "niceness": v[1], "timed_cpus": v[2]} for k, v in settings.items()},
        "steps_per_setting": {k: len(v) for k, v in times.items()},
        "median_ms": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "p90_ms": {k: round(sorted(v)[int(0.9 * (len(v) - 1))], 3) for k, v in times.items()},
        "step_ms": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }
    quiet = result["median_ms"]["quiet"]
    result["slowdown_vs_quiet"] = {k: round(v / quiet, 3) for k, v in result["median_ms"].items()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("gpu", "median_ms", "p90_ms", "slowdown_vs_quiet")}))


if __name__ == "__main__":
    main()
