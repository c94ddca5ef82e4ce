"""GPU-stack sanity checks the articles make or imply. Each: pass / fail / skip, with the reason and a one-line fix.
Apex itself is verified where it is built (amprepro.env.apexbuild.verify), not here.

A required check that fails stops the pipeline (non-zero exit, the failures printed first).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from amprepro.files import write_json


def check(name, status, detail, fix="", required=False):
    return {"name": name, "status": status, "detail": detail, "fix": fix if status == "fail" else "",
            "required": required}


def torch_checks(torch, expect_gpu: bool) -> list[dict]:
    cuda = torch.cuda.is_available()
    results = [
        check("torch version", "pass", f"torch {torch.__version__} (CUDA build: {torch.version.cuda})", required=True),
        check("cuda.is_available", "pass" if cuda else ("fail" if expect_gpu else "skip"),
              "a CUDA GPU is usable" if cuda else "no CUDA GPU usable by torch",
              "nvidia-smi sees a GPU but torch does not: install a CUDA build of torch that matches the driver",
              required=expect_gpu),
    ]
    if not cuda:
        skip = "no CUDA GPU"
        results += [check(n, "skip", skip) for n in ("cuDNN", "GPU name", "compute capability", "Tensor Cores",
                                                     "bf16 support")]
        return results
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability(0)
    cudnn_ok = torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
    results += [
        check("cuDNN", "pass" if cudnn_ok else "fail",
              f"cuDNN {torch.backends.cudnn.version()} enabled={torch.backends.cudnn.enabled}",
              "install a torch build with cuDNN and leave torch.backends.cudnn.enabled on", required=True),
        check("GPU name", "pass",
              f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} GPU(s)"),
        check("compute capability", "pass", f"sm_{major}{minor}"),
        check("Tensor Cores", "pass" if major >= 7 else "fail", f"compute capability {major}.{minor}",
              "fp16 speedups need Tensor Cores (compute capability >= 7.0, Volta or newer)"),
        check("bf16 support", "pass" if torch.cuda.is_bf16_supported() else "fail",
              f"torch.cuda.is_bf16_supported() = {torch.cuda.is_bf16_supported()}",
              "bf16 needs compute capability >= 8.0 (Ampere or newer); use amp_fp16 instead"),
    ]
    return results


def toolkit_checks(torch, apex_required: bool) -> list[dict]:
    """The nvcc apex's build will choose (amprepro.env.apexbuild.cudakit: a matching system toolkit, else pip's)."""
    if torch.version.cuda is None:
        return [check("nvcc vs torch CUDA", "skip", "CPU-only torch build: nothing is compiled against CUDA"),
                check("CUDA_HOME and cuda_runtime.h", "skip", "CPU-only torch build")]
    from amprepro.env.apexbuild import ApexError, cudakit, toolchain  # a CUDA env has packaging (the build's)

    env, torch_cuda = dict(os.environ), torch.version.cuda
    system, problem = toolchain.find_nvcc(env)
    try:
        decision = cudakit.decide(env, torch_cuda, system, problem)
    except ApexError as exc:
        decision = cudakit.Decision(None, str(exc), system)
    fix = (f"install the CUDA toolkit {torch_cuda} (or conda cuda-nvcc) and set CUDA_HOME, "
           f"{cudakit.pip_route_hint(torch_cuda, env)}")
    if decision.route is None:
        return [check("nvcc vs torch CUDA", "fail", decision.reason, fix, required=apex_required),
                check("CUDA_HOME and cuda_runtime.h", "skip", "no nvcc to take CUDA_HOME from")]
    if decision.route == "pip":
        home = cudakit.installed_home(decision.requirements, Path(sys.prefix))
        state = f"installed, CUDA_HOME={home}" if home else "installed by the apex_build job, which checks it"
        return [check("nvcc vs torch CUDA", "pass",
                      f"{decision.reason}: apex builds with nvcc {torch_cuda} from pip ({decision.requirements.name}, "
                      f"{state})", required=apex_required),
                check("CUDA_HOME and cuda_runtime.h", "pass" if home and (home / "include/cuda_runtime.h").is_file()
                      else "skip", f"pip toolkit {state}")]
    same = system.release == torch_cuda
    version = check("nvcc vs torch CUDA", "pass" if same else "fail",
                    f"nvcc {system.release} ({system.path}, {system.found_via}), torch built with CUDA {torch_cuda}"
                    f" ({decision.reason})",
                    f"apex 25.05 demands equality: {fix}, or a torch built for CUDA {system.release}",
                    required=apex_required)
    header = Path(system.cuda_home, "include", "cuda_runtime.h")
    headers = check("CUDA_HOME and cuda_runtime.h", "pass" if header.exists() else "fail",
                    f"CUDA_HOME={system.cuda_home}, cuda_runtime.h {'found' if header.exists() else 'missing'}",
                    "point CUDA_HOME at a full toolkit (runtime-only images and conda cudatoolkit lack the headers), "
                    f"{cudakit.pip_route_hint(torch_cuda, env)}", required=apex_required)
    return [version, headers]


def autocast_checks(torch) -> list[dict]:
    results = []
    devices = [("cpu", torch.bfloat16)] + ([("cuda", torch.float16), ("cuda", torch.bfloat16)]
                                          if torch.cuda.is_available() else [])
    for device, dtype in devices:
        a = torch.randn(8, 8, device=device)
        with torch.autocast(device, dtype=dtype):
            mm = (a @ a).dtype
            softmax = torch.softmax(a, dim=-1).dtype if device == "cuda" else None
        expected_softmax = torch.float32 if device == "cuda" else None
        ok = mm == dtype and softmax == expected_softmax
        results.append(check(f"autocast {device} {str(dtype).replace('torch.', '')}", "pass" if ok else "fail",
                             f"matmul -> {mm}" + (f", softmax -> {softmax}" if softmax else ""),
                             "autocast op lists changed: check the torch version", required=True))
    return results


class PlainSGD:
    """What GradScaler uses of an optimizer (param_groups, step), without torch.optim.Optimizer: building one imports
    torch._dynamo (4-8 s on a 2-core machine, measured 2026-12-02), and this check runs before every cell."""

    def __init__(self, torch, params, lr: float):
        self.torch, self.param_groups = torch, [{"params": list(params), "lr": lr}]

    def step(self):
        with self.torch.no_grad():
            for group in self.param_groups:
                for param in group["params"]:
                    param -= group["lr"] * param.grad


def grad_scaler_check(torch) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weight = torch.nn.Parameter(torch.ones(4, device=device))
    optimizer = PlainSGD(torch, [weight], lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**16)
    scaler.scale((weight * 2).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    ok = torch.allclose(weight.detach(), torch.full_like(weight, 0.8))
    return check(f"GradScaler round trip ({device})", "pass" if ok else "fail",
                 f"scaled backward + unscale gave weight {weight.detach().tolist()[:2]}..., scale {scaler.get_scale()}",
                 "GradScaler did not unscale gradients: check the torch install", required=True)


def kernel_check() -> dict:
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return check("Jupyter kernel python3", "skip", "jupyter_client is not in this env; the report env checks it")
    specs = KernelSpecManager().find_kernel_specs()
    ok = "python3" in specs
    return check("Jupyter kernel python3", "pass" if ok else "fail",
                 f"kernel python3 at {specs.get('python3')}" if ok else f"kernels found: {sorted(specs)}",
                 "pip install ipykernel in the report env (papermill runs the report with kernel python3)")


# The model libraries (amprepro.train.models.ARCH_PACKAGES) and what shows that one loads against this torch: its
# compiled operators register with torch at import, so a torchvision built for another torch (a CPU torch beside the
# CUDA torchvision from PyPI) fails there with `operator torchvision::nms does not exist`; nms runs one of them.
LIBRARY_FIX = {
    "torchvision": ("install the torchvision release built for this torch, from the same index this torch came from "
                    "(requirements.txt pins the pair: torch 2.13.0 with torchvision 0.28.0; a CPU torch needs the CPU "
                    "torchvision of PyTorch's CPU index), e.g. `.venv/bin/python -m pip install --force-reinstall "
                    "--no-deps torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu` for a CPU torch; "
                    "then run again"),
    "timm": ("make torchvision load first (timm imports it), then `.venv/bin/python -m pip install timm==1.0.26` "
             "(requirements.txt's pin); then run again"),
}


def libraries_for(archs: list[str]) -> tuple[str, ...]:
    """The model libraries these archs are built from (amprepro.train.models.ARCH_PACKAGES)."""
    from amprepro.train.models import ARCH_PACKAGES

    return tuple(sorted({ARCH_PACKAGES[arch] for arch in archs if arch in ARCH_PACKAGES}))


def library_check(torch, package: str, needed: bool) -> dict:
    """Whether a model library loads against this torch. Required when the run has a model built from it and the
    library does not import; a torchvision that imports but whose compiled operators do not match this torch (a CPU
    torch beside PyPI's CUDA torchvision: `operator torchvision::nms does not exist` on the first call) is flagged with
    the fix but does not stop the run: its models are Python over torch's own ops and build and train."""
    name = f"{package} loads against torch {torch.__version__}"
    try:
        module = importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name == package and not needed:
            return check(name, "skip", f"{package} is not installed; no model of this run needs it")
        if exc.name == package:
            return check(name, "fail", f"{package} is not installed, and a model of this run needs it",
                         LIBRARY_FIX[package], required=True)
        return check(name, "fail", f"{package} does not import ({exc})", LIBRARY_FIX[package], required=needed)
    except Exception as exc:  # RuntimeError: operator torchvision::nms does not exist, raised as it registers
        return check(name, "fail", f"{package} does not load against this torch ({_first_line(exc)})",
                     LIBRARY_FIX[package], required=needed)
    if package == "torchvision":  # a compiled operator: the import alone can pass with a mismatched build
        try:
            boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
            kept = module.ops.nms(boxes, torch.tensor([0.9, 0.8]), 0.5)
            assert kept.tolist() == [0], f"nms kept {kept.tolist()} of two equal boxes"
        except Exception as exc:
            return check(name, "fail", f"{package} imports, but its compiled operators do not work with this torch "
                         f"({_first_line(exc)}); its models build from torch's own ops, so the cells still run",
                         LIBRARY_FIX[package], required=False)
    version = getattr(module, "__version__", "?")
    ran = " and its nms operator runs" if package == "torchvision" else ""
    return check(name, "pass", f"{package} {version} imports{ran}")


def _first_line(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run_checks(apex_required: bool, expect_gpu: bool, archs: tuple[str, ...] = (),
               seconds: dict | None = None) -> list[dict]:
    """Every check, in order; `seconds` (when given) gets each group's wall time, for the job's log."""
    seconds = {} if seconds is None else seconds

    def timed(name, run, *args):
        started = time.perf_counter()
        try:
            return run(*args)
        finally:
            seconds[name] = round(time.perf_counter() - started, 2)

    try:
        torch = timed("torch import", importlib.import_module, "torch")
    except ImportError as exc:
        return [check("torch import", "fail", f"{sys.executable}: {exc}",
                      "the `python` the jobs run has no torch: start the pipeline with `make run` (it puts .venv/bin "
                      "first on PATH), activate the venv, or use `snakemake --use-conda`", required=True)]
    needs = libraries_for(archs)  # after torch: amprepro.train.models imports it
    return (timed("torch", torch_checks, torch, expect_gpu) + timed("toolkit", toolkit_checks, torch, apex_required)
            + timed("autocast", autocast_checks, torch) + [timed("GradScaler", grad_scaler_check, torch)]
            + [timed(package, library_check, torch, package, package in needs) for package in LIBRARY_FIX]
            + [timed("Jupyter kernel", kernel_check)])


def unmet_lines(path: str | Path) -> list[str]:
    """The checks in a sanity.json (main's record) that failed without stopping the run, one console line each with
    its fix; none where there is no readable record. A required check that fails stops the run in main, before any
    cell; one that is not (a library none of the run's models is built from, bf16 or Tensor Cores the GPU lacks, the
    toolkit where apex is not required) shows in the report and the job's log, where a run that ends well is not
    read: workflow/Snakefile says these lines again when Snakemake ends (onsuccess)."""
    try:
        checks = json.loads(Path(path).read_text()).get("checks", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [f"amprepro: WARNING: the stack's check \"{c.get('name')}\" failed: {c.get('detail')}. It is not "
            "required for this run, which went on. "
            f"Fix: {c.get('fix') or 'see results/logs/sanity.log'}"
            for c in checks if isinstance(c, dict) and c.get("status") == "fail"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--apex-required", choices=["True", "False"], required=True,
                        help="whether a toolkit apex cannot build with fails the check (apex is verified by its job)")
    parser.add_argument("--expect-gpu", choices=["True", "False"], required=True)
    parser.add_argument("--archs", nargs="*", default=[],
                        help="the archs of this run's models: the check of a library one is built from is required")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    seconds = {}
    results = run_checks(args.apex_required == "True", args.expect_gpu == "True", tuple(args.archs), seconds)
    for r in results:
        print(f"[{r['status']:4}] {r['name']}: {r['detail']}" + (f"  FIX: {r['fix']}" if r["fix"] else ""))
    # where the job's time goes, for its log (sanity.json holds the checks alone, equal for an equal outcome)
    print("sanity: seconds: " + ", ".join(f"{name} {s:.2f}" for name, s in seconds.items()), file=sys.stderr)
    blocking = [r for r in results if r["status"] == "fail" and r["required"]]
    if blocking:
        for r in blocking:
            print(f"ERROR: required sanity check failed: {r['name']}: {r['detail']}. Fix: {r['fix']}", file=sys.stderr)
        sys.exit(1)
    write_json(args.out, {"checks": results, "passed": sum(r["status"] == "pass" for r in results),
                          "failed": sum(r["status"] == "fail" for r in results),
                          "skipped": sum(r["status"] == "skip" for r in results)})


if __name__ == "__main__":
    main()
