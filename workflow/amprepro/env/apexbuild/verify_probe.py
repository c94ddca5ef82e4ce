"""Exercise what an apex build promised, in a process of its own: put the apex site dir first, import torch, run the
checks, print one JSON object as the last line.

    python -m amprepro.plan.cellserver --run apex_probe -- SITE_DIR CHECKS EXTENSIONS [ABSENT]
    python -m amprepro.env.apexbuild.verify_probe SITE_DIR CHECKS EXTENSIONS [ABSENT]

(comma-separated lists; ABSENT: what a shell lacks). amprepro.env.apexbuild.verify starts it the first way: forked
from the run's cell server where `make run` started one, so it checks apex in the process the cells use it in (torch,
torch._dynamo and the model libraries imported, apex not: a server whose imports loaded an apex forks no job that uses
apex, amprepro.plan.cellserver.stray_apex), and it pays neither import torch (3.4 s on an H200 box)
nor torch._dynamo's import at the first optimizer step (fresh, each process's first GPU check took about 4 s on an
H100 box, results-reference/perf/99d30cf-h100); elsewhere a fresh interpreter.
This module imports nothing of amprepro's, and torch before apex: apex's extensions link libc10.
"""

import copy
import importlib
import json
import os
import sys
import time
import traceback

SITE_DIR, CHECKS, EXTENSIONS, ABSENT = "", [], [], []
torch = None  # imported by main, after the site dir is put first
GPU_CHECKS = {"fused_adam", "fused_layer_norm", "amp_O1", "amp_O2"}


def max_diff(a, b):
    return float((a.detach().float() - b.detach().float()).abs().max())


def check_imports():
    modules = import_each(EXTENSIONS)
    try:
        import apex

        where = apex.__file__ or ""
    except Exception as exc:
        where = f"apex not importable: {type(exc).__name__}: {exc}"
    ok = where.startswith(SITE_DIR) and all(m["importable"] for m in modules.values())
    return ok, {"apex_file": where, "extensions": modules}


def import_each(names):
    modules = {}
    for name in names:
        try:
            module = importlib.import_module(name)
            modules[name] = {"importable": True, "error": None, "file": getattr(module, "__file__", None)}
        except Exception as exc:
            modules[name] = {"importable": False, "error": f"{type(exc).__name__}: {exc}"}
    return modules


def check_absent():
    """A shell: each extension the full build has must fail to import; apex's own error is kept for the record."""
    modules = import_each(ABSENT)
    return not any(m["importable"] for m in modules.values()), {"extensions": modules}


def check_apex_c():
    import apex_C

    tensors = [torch.arange(6.0).reshape(2, 3), torch.ones(4)]
    flat = apex_C.flatten(tensors)
    back = apex_C.unflatten(flat, tensors)
    ok = flat.numel() == 10 and all(torch.equal(a, b) for a, b in zip(tensors, back))
    return ok, {"flat_numel": flat.numel()}


def check_fused_adam():
    from apex.optimizers import FusedAdam

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
    fused = copy.deepcopy(reference)
    start = [p.detach().clone() for p in fused.parameters()]
    optimizers = [(reference, torch.optim.Adam(reference.parameters(), lr=1e-3)),
                  (fused, FusedAdam(fused.parameters(), lr=1e-3))]
    x = torch.randn(32, 64, device="cuda")
    for _ in range(3):
        for model, optimizer in optimizers:
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    torch.cuda.synchronize()
    diff = max(max_diff(a, b) for a, b in zip(reference.parameters(), fused.parameters()))
    moved = max(max_diff(a, b) for a, b in zip(start, fused.parameters()))
    return diff < 1e-5 and moved > 1e-4, {"steps": 3, "max_abs_diff_vs_torch_adam": diff, "max_update": moved}


def check_fused_layer_norm():
    import apex.normalization.fused_layer_norm as fln
    from apex.normalization import FusedLayerNorm

    torch.manual_seed(0)
    layer = FusedLayerNorm(256).cuda()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    x = torch.randn(8, 32, 256, device="cuda", requires_grad=True)
    grad = torch.randn(8, 32, 256, device="cuda")
    layer(x).backward(grad)
    x2 = x.detach().clone().requires_grad_()
    w2, b2 = (p.detach().clone().requires_grad_() for p in (layer.weight, layer.bias))
    y2 = torch.nn.functional.layer_norm(x2, (256,), w2, b2, layer.eps)
    y2.backward(grad)
    y = layer(x.detach())
    diffs = {"forward": max_diff(y, y2), "grad_input": max_diff(x.grad, x2.grad),
             "grad_weight": max_diff(layer.weight.grad, w2.grad), "grad_bias": max_diff(layer.bias.grad, b2.grad)}
    fused_kernel = getattr(fln, "fused_layer_norm_cuda", None) is not None
    return fused_kernel and max(diffs.values()) < 1e-3, {"max_abs_diff": diffs, "fused_kernel_loaded": fused_kernel}


def check_amp(level):
    from apex import amp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=0)
    start = [p.detach().float().clone() for p in model.parameters()]
    x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    for attempt in range(1, 6):  # noqa: B007 (read after the loop); the loss scale may skip the first steps on overflow
        optimizer.zero_grad()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        moved = max(max_diff(a, b) for a, b in zip(start, model.parameters()))
        if moved > 0:
            break
    from apex.multi_tensor_apply import multi_tensor_applier

    detail = {"steps": attempt, "loss": float(loss), "logits_dtype": str(logits.dtype),
              "fused_kernels": bool(multi_tensor_applier.available),  # False in a shell: Python fallback
              "weight_dtype": str(next(model.parameters()).dtype),
              "loss_scale": float(amp._amp_state.loss_scalers[0].loss_scale()), "max_update": moved}
    return moved > 0 and bool(torch.isfinite(loss)), detail


CHECKS_BY_NAME = {"imports": check_imports, "absent": check_absent, "apex_C": check_apex_c,
                  "fused_adam": check_fused_adam,
                  "fused_layer_norm": check_fused_layer_norm,
                  "amp_O1": lambda: check_amp("O1"), "amp_O2": lambda: check_amp("O2")}


def run(name):
    if name in GPU_CHECKS and not torch.cuda.is_available():
        return {"ok": None, "skipped": "no CUDA device visible", "seconds": 0.0}
    start = time.monotonic()
    try:
        ok, detail = CHECKS_BY_NAME[name]()
        result = {"ok": bool(ok), **detail}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


def main(argv: list[str]) -> None:
    global SITE_DIR, CHECKS, EXTENSIONS, ABSENT, torch
    SITE_DIR, CHECKS, EXTENSIONS = argv[0], argv[1].split(","), [e for e in argv[2].split(",") if e]
    ABSENT = [e for e in argv[3].split(",") if e] if len(argv) > 3 else []
    sys.path.insert(0, SITE_DIR)
    import torch as imported  # extensions link libc10: torch first (already imported where forked)

    torch = imported
    report = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "torch": torch.__version__, "checks": {name: run(name) for name in CHECKS},
              # amprepro.plan.cellserver.ORIGIN_ENV, set in a forked child (named here: nothing of amprepro imported)
              "process": os.environ.get("AMPREPRO_CELL_PROCESS", "a fresh interpreter")}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
