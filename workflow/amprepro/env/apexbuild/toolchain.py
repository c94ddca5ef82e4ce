"""Facts about the build machine that enter the cache key: the Python/torch that will build, nvcc, the GPU arch.

Gathered in seconds and without importing torch into this process (it may be a CPU-only launcher).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from amprepro.env.apexbuild import cudakit
from amprepro.env.apexbuild.cudakit import Nvcc, nvcc_release
from amprepro.env.apexbuild.errors import ApexError

DEFAULT_CUDA_HOMES = ("/usr/local/cuda",)

# Key facts without importing torch (a rerun must take seconds): torch/version.py is plain assignments.
KEY_PROBE = r"""
import importlib.util, json, pathlib, sys, sysconfig
out = {"python": sys.version.split()[0], "soabi": sysconfig.get_config_var("SOABI"), "executable": sys.executable,
       "torch": None, "torch_cuda": None, "torch_git": None, "torch_site": None}
spec = importlib.util.find_spec("torch")
version_file = pathlib.Path(spec.origin).parent / "version.py" if spec and spec.origin else None
if spec and spec.origin:
    out["torch_site"] = str(pathlib.Path(spec.origin).parent.parent)
if version_file and version_file.is_file():
    found = {}
    exec(compile(version_file.read_text(), str(version_file), "exec"), found)
    out.update(torch=found.get("__version__"), torch_cuda=found.get("cuda"), torch_git=found.get("git_version"))
print(json.dumps(out))
"""

# What the build needs from the interpreter; only run before compiling.
BUILD_PROBE = r"""
import importlib.metadata as md, json, sys
out = {"executable": sys.executable}
try:
    import torch
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, torch_error=None)
except Exception as exc:
    out.update(torch=None, torch_cuda=None, torch_error=f"{type(exc).__name__}: {exc}")
try:
    import torch.utils.cpp_extension as cpp_extension
    out.update(cpp_extension_error=None, ninja=bool(cpp_extension.is_ninja_available()))
except Exception as exc:
    out.update(cpp_extension_error=f"{type(exc).__name__}: {exc}", ninja=None)
try:
    out["pip"] = md.version("pip")
except md.PackageNotFoundError:
    out["pip"] = None
out["apex_dists"] = [{"version": d.version, "summary": d.metadata.get("Summary") or "",
                      "path": str(getattr(d, "_path", ""))}
                     for d in md.distributions() if (d.metadata.get("Name") or "").lower() == "apex"]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Toolchain:
    python: dict
    nvcc: Nvcc | None
    nvcc_problem: str | None
    arch_list: str | None
    arch_source: str


def survey(needs_cuda: bool, env: dict, configured_arch: str | None, echo=print) -> Toolchain:
    """The facts of the cache key; with CUDA extensions asked for, the nvcc chosen (amprepro.env.apexbuild.cudakit:
    a system one matching torch's CUDA release, else pip's, installed into the env when missing)."""
    python = probe_python(KEY_PROBE, env)
    if not needs_cuda:
        return Toolchain(python, None, None, None, "not needed: no CUDA extension is requested")
    system, problem = find_nvcc(env)
    nvcc, problem = cudakit.choose(env, python["torch_cuda"], system, problem, torch_site=python["torch_site"],
                                   echo=echo)
    if nvcc is not None:
        echo(f"[apex] nvcc: {nvcc.source} {nvcc.release} at {nvcc.path} ({nvcc.reason})", flush=True)
    if configured_arch:
        arch, arch_source = normalize_arch(configured_arch), "apex.cuda_arch_list"
    else:
        arch, arch_source = detect_arch(env)
    return Toolchain(python, nvcc, problem, arch, arch_source)


def probe_python(probe: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise ApexError(f"{sys.executable} could not run a 1-line probe: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def find_nvcc(env: dict) -> tuple[Nvcc | None, str | None]:
    """nvcc the way torch.utils.cpp_extension finds CUDA_HOME, plus an activated env's cuda-nvcc; or why not."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if home := env.get(variable):
            nvcc = Path(home) / "bin" / "nvcc"
            if not os.access(nvcc, os.X_OK):
                return None, (f"{variable}={home} has no bin/nvcc. Fix: export {variable}=<CUDA toolkit root> "
                              f"(e.g. /usr/local/cuda), or unset it so nvcc is found on PATH.")
            return _nvcc(nvcc, variable), None
    candidates = [(shutil.which("nvcc", path=env.get("PATH", "")), "PATH")]
    if prefix := env.get("CONDA_PREFIX"):
        candidates.append((str(Path(prefix) / "bin" / "nvcc"), "CONDA_PREFIX (cuda-nvcc)"))
    candidates += [(str(Path(home) / "bin" / "nvcc"), "default location") for home in DEFAULT_CUDA_HOMES]
    for path, via in candidates:
        if path and os.access(path, os.X_OK):
            return _nvcc(Path(path), via), None
    return None, ("nvcc (the CUDA compiler) was not found: CUDA_HOME is unset, there is no nvcc on PATH, in "
                  "$CONDA_PREFIX/bin or in /usr/local/cuda. Fix: export CUDA_HOME=<CUDA toolkit root>, or install "
                  "the toolkit matching torch.version.cuda (conda: cuda-nvcc and cuda-cudart-dev of that version; "
                  "runtime-only images have no nvcc, use a 'devel' one)")


def _nvcc(path: Path, via: str) -> Nvcc:
    return Nvcc(str(path), str(path.parent.parent), via, nvcc_release(str(path)))


def normalize_arch(arch_list: str) -> str:
    return ";".join(part for part in re.split(r"[ ;]+", arch_list.strip()) if part)


def detect_arch(env: dict) -> tuple[str | None, str]:
    smi = shutil.which("nvidia-smi", path=env.get("PATH", ""))
    if smi is None:
        return None, "no GPU to detect: nvidia-smi is not on PATH"
    try:
        done = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi failed: {exc}"
    caps = sorted({line.strip() for line in done.stdout.splitlines() if re.fullmatch(r"\d+\.\d+", line.strip())},
                  key=lambda cap: tuple(int(p) for p in cap.split(".")))
    if done.returncode != 0 or not caps:
        return None, f"nvidia-smi reports no GPU (exit {done.returncode})"
    return ";".join(caps), "detected with nvidia-smi"


def gpu_identity(env: dict) -> str:
    """Which GPUs this process would use: verification results are valid for exactly these."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH", ""))
    if smi is None:
        return "none (no nvidia-smi)"
    try:
        done = subprocess.run([smi, "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return " | ".join(done.stdout.strip().splitlines()) + (f" | CUDA_VISIBLE_DEVICES={visible}" if visible else "")
