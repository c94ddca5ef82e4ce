"""Where does fp16 + GradScaler lose time against bf16? Times one model's training step in several ways.

    PYTHONPATH=workflow python tools/gpu/fp16_overhead.py --arch vit_base_patch16_224 --batch 128 --out overhead.json

Each variant: fresh model and AdamW, warm-up steps, then the mean step time over the timed steps from CUDA events,
with the loss read back every step (the unread_ variants: not, as in a cell's timed loop). Variants: the cell's own
bf16 and fp16 steps (amprepro.train.precision.Trainer), fp16 autocast with no scaler (what timm's benchmark.py
times), a bare GradScaler step with no loss-scale read-back, the same with torch's fused AdamW (no host sync in
scaler.step), and a prototype that skips an overflowing step on the device (scaler_step).
"""

import argparse
import json

import torch

from amprepro.train import data, models, precision, train


def make(arch, batch, device, fused=False):
    torch.manual_seed(0)
    model = models.build(arch, {"image_size": 224}).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    batches = data.SyntheticImages(batch, 224, 0, device)
    return model, optimizer, batches


def trainer_step(name):
    def setup(arch, batch, device):
        model, optimizer, batches = make(arch, batch, device)
        trainer = precision.Trainer(name, model, optimizer, train.cross_entropy, device)
        return lambda: float(trainer.step(*batches.next()).loss)
    return setup


def no_scaler_step(arch, batch, device):
    model, optimizer, batches = make(arch, batch, device)

    def step(read=True):
        x, y = batches.next()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = train.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss) if read else loss
    return step


def autocast_fp16_no_scaler(arch, batch, device):
    step = no_scaler_step(arch, batch, device)
    return lambda: step()


def bare_scaler(fused):
    def setup(arch, batch, device):
        model, optimizer, batches = make(arch, batch, device, fused)
        scaler = torch.amp.GradScaler("cuda")

        def step():
            x, y = batches.next()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = train.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            return float(loss)
        return step
    return setup


def unread(setup):
    """The variant's step without reading its loss back: as a cell's timed loop runs (it reads after the loop)."""
    def wrapped(arch, batch, device):
        step = setup(arch, batch, device)
        return lambda: step(read=False)
    return wrapped


def scaler_step(fused=False, device_skip=False):
    """fp16 with a GradScaler, the loss not read back. device_skip: foreach AdamW with capturable=True, stepped
    without GradScaler.step's host read of the inf flag; where the flag is set, the parameters and the optimizer's
    state are put back as they were, on the device (torch.where), so the step is skipped as GradScaler skips it. A
    prototype for issue 40's fp16 parity: timing only (a first step that overflows would leave Adam's state made)."""
    def setup(arch, batch, device):
        model, optimizer, batches = make(arch, batch, device, fused)
        if device_skip:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True, capturable=True)
        scaler = torch.amp.GradScaler("cuda")
        params = list(model.parameters())

        def step(read=True):
            x, y = batches.next()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = train.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if not device_skip or not optimizer.state:
                scaler.step(optimizer)
            else:
                scaler.unscale_(optimizer)
                found = sum(scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())
                held = params + [t for p in params for t in optimizer.state[p].values()]
                with torch.no_grad():
                    before = torch._foreach_add(held, 0)  # copies
                optimizer.step()
                skip = found > 0
                with torch.no_grad():
                    for now, then in zip(held, before):
                        now.copy_(torch.where(skip, then, now))
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            return float(loss) if read else loss
        return step
    return setup


VARIANTS = {
    "cell_amp_bf16": trainer_step("amp_bf16"),
    "cell_amp_fp16": trainer_step("amp_fp16"),
    "fp16_autocast_no_scaler": autocast_fp16_no_scaler,
    "fp16_gradscaler_bare": bare_scaler(fused=False),
    "fp16_gradscaler_bare_fused_adamw": bare_scaler(fused=True),
    # the loss not read back each step, as in a cell's timed loop (timm's benchmark reads none either)
    "unread_fp16_autocast_no_scaler": unread(lambda a, b, d: no_scaler_step(a, b, d)),
    "unread_fp16_gradscaler_foreach": unread(scaler_step()),
    "unread_fp16_gradscaler_fused": unread(scaler_step(fused=True)),
    "unread_fp16_gradscaler_foreach_device_skip": unread(scaler_step(device_skip=True)),
}


def time_steps(step, warmup, steps):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="vit_base_patch16_224")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2, help="every variant this many times, interleaved")
    parser.add_argument("--only", help="a prefix: only the variants whose name starts with it (e.g. unread_)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    chosen = {name: setup for name, setup in VARIANTS.items() if name.startswith(args.only or "")}
    results = {name: [] for name in chosen}
    for _ in range(args.rounds):
        for name, setup in chosen.items():
            seconds = time_steps(setup(args.arch, args.batch, device), args.warmup, args.steps)
            results[name].append(seconds)
            print(f"{name:36s} {seconds * 1000:7.2f} ms/step  {args.batch / seconds:8.1f} samples/s", flush=True)
            torch.cuda.empty_cache()
    summary = {name: {"step_ms": [s * 1000 for s in times], "samples_per_s_best": args.batch / min(times)}
               for name, times in results.items()}
    with open(args.out, "w") as handle:
        json.dump({"arch": args.arch, "batch": args.batch, "gpu": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "variants": summary}, handle, indent=2)


if __name__ == "__main__":
    main()
