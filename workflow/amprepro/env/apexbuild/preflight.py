"""Preflight: everything that would make the compile fail, found in seconds and reported as cause + fix.

Runs only before a real compile (a cache hit needs none of it). Each check returns problem strings; all problems
are reported together so one round of fixes suffices.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from packaging.version import Version

from amprepro.env.apexbuild.cudakit import pip_route_hint
from amprepro.env.apexbuild.errors import ApexError
from amprepro.env.apexbuild.setup_inspect import SetupFacts
from amprepro.env.apexbuild.toolchain import BUILD_PROBE, Toolchain, probe_python

MIN_PIP = Version("23.1")  # first pip that hands --config-settings to setuptools' build_wheel
NVIDIA_APEX_SUMMARY = "PyTorch Extensions written by NVIDIA"
PROBE_KERNEL = "#include <cuda_runtime.h>\n__global__ void probe() {}\nint main() { probe<<<1, 1>>>(); return 0; }\n"


def preflight(tools: Toolchain, setup: SetupFacts, flags: list[str], env: dict) -> None:
    python = probe_python(BUILD_PROBE, env)
    problems = python_problems(python) + cxx_problems(env)
    if setup.needs_cuda(flags):
        problems += cuda_problems(tools, python, setup, env)
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        raise ApexError(f"apex preflight found {len(problems)} problem(s) before compiling:\n{listed}")


def python_problems(python: dict) -> list[str]:
    problems = []
    if python["torch_error"]:
        problems.append(f"torch is not importable by {python['executable']} ({python['torch_error']}). Fix: build "
                        "in the env the runs use, with torch installed.")
    elif python["cpp_extension_error"]:
        problems.append(f"torch.utils.cpp_extension cannot be imported ({python['cpp_extension_error']}); it "
                        "compiles apex. Fix: install setuptools in this env (pip install setuptools), then retry.")
    elif not python["ninja"]:
        problems.append("ninja is not available, so torch would compile every source file serially (an hour "
                        "instead of minutes). Fix: pip install ninja (or conda install ninja) in this env.")
    if python["pip"] is None or Version(python["pip"]) < MIN_PIP:
        problems.append(f"pip {python['pip']} is older than {MIN_PIP}: it does not pass --config-settings to the "
                        "build, so --cpp_ext/--cuda_ext would be dropped silently. Fix: pip install 'pip>=23.1'.")
    for dist in python["apex_dists"]:
        if NVIDIA_APEX_SUMMARY not in dist["summary"]:
            problems.append(f"the unrelated PyPI package 'apex' {dist['version']} ({dist['summary'] or 'no summary'}"
                            f"; {dist['path']}) is installed; it shadows NVIDIA apex for anything that imports apex "
                            "without our site dir first (ImportError ... pyramid.session). Fix: pip uninstall apex.")
    return problems


def cxx_problems(env: dict) -> list[str]:
    cxx = env.get("CXX", "c++")
    if shutil.which(cxx, path=env.get("PATH", "")) is None:
        return [f"no C++ compiler: '{cxx}' (from {'CXX' if 'CXX' in env else 'the default c++'}) is not found. "
                "Fix: install g++ (apt install g++, or conda install gxx) or set CXX to a compiler."]
    return []


def cuda_problems(tools: Toolchain, python: dict, setup: SetupFacts, env: dict) -> list[str]:
    problems = []
    if python["torch"] and python["torch_cuda"] is None:
        problems.append(f"torch {python['torch']} is a CPU-only build (torch.version.cuda is None), so "
                        "CUDA extensions cannot be built against it. Fix: install a CUDA build of torch.")
    if tools.nvcc is None:
        problems.append(tools.nvcc_problem)
    else:
        problems += nvcc_problems(tools, python["torch_cuda"], setup, env)
    if tools.arch_list is None:
        problems.append(f"no GPU architecture to compile for ({tools.arch_source}); a login/CPU node has no GPU "
                        "to detect. Fix: set apex.cuda_arch_list, e.g. '9.0' for H100/H200, '8.0' for A100.")
    return problems


def nvcc_problems(tools: Toolchain, torch_cuda: str | None, setup: SetupFacts, env: dict) -> list[str]:
    nvcc = tools.nvcc
    if nvcc.release is None:
        return [f"{nvcc.path} (found via {nvcc.found_via}) does not run or print a release. Fix: repair the "
                "CUDA toolkit or point CUDA_HOME at a working one."]
    problems = []
    if torch_cuda and mismatch(nvcc.release, torch_cuda, setup.strict_cuda_check):
        rule = "must equal" if setup.strict_cuda_check else "must have the same major version as"
        problems.append(f"nvcc {nvcc.release} ({nvcc.path}, {nvcc.reason or nvcc.found_via}) {rule} the CUDA "
                        f"torch was built with ({torch_cuda}) for this apex source. Fix: use a {torch_cuda} toolkit "
                        f"(CUDA_HOME=..., or conda install cuda-nvcc={torch_cuda} cuda-cudart-dev={torch_cuda}), "
                        f"{pip_route_hint(torch_cuda, env)}, or a torch built for CUDA {nvcc.release}.")
    header = Path(nvcc.cuda_home) / "include" / "cuda_runtime.h"
    if not header.is_file():
        problems.append(f"{header} is missing, so torch cannot compile against the CUDA runtime "
                        f"(cc1plus: fatal error: cuda_runtime.h). Fix: install the CUDA headers (conda: "
                        f"cuda-cudart-dev), or set CUDA_HOME to a full toolkit root (now {nvcc.cuda_home}, from "
                        f"{nvcc.found_via}).")
    if tools.arch_list:
        problems += arch_problems(nvcc.path, tools.arch_list)
    problems += host_compiler_problems(nvcc.path, {**env, **nvcc.env})
    return problems


def mismatch(nvcc_release: str, torch_cuda: str, strict: bool) -> bool:
    if strict:
        return Version(nvcc_release) != Version(torch_cuda)
    return Version(nvcc_release).major != Version(torch_cuda).major


def arch_problems(nvcc: str, arch_list: str) -> list[str]:
    listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout.split()
    if not listed:
        return []
    unsupported = [arch for arch in arch_list.split(";")
                   if f"compute_{arch.replace('+PTX', '').replace('.', '')}" not in listed]
    if not unsupported:
        return []
    return [f"nvcc {nvcc} cannot compile for {', '.join(unsupported)} (it supports {listed[0]}..{listed[-1]}). "
            "Fix: drop those from apex.cuda_arch_list / TORCH_CUDA_ARCH_LIST, or use an older CUDA for them."]


def host_compiler_problems(nvcc: str, env: dict) -> list[str]:
    """nvcc refuses host compilers newer than it knows; a one-line kernel shows it in a second."""
    command = [nvcc, "-c", "probe.cu", "-o", "probe.o"] + (["-ccbin", env["CC"]] if env.get("CC") else [])
    with tempfile.TemporaryDirectory(prefix="apex-preflight-") as tmp:
        (Path(tmp) / "probe.cu").write_text(PROBE_KERNEL)
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode == 0:
        return []
    output = (done.stdout + done.stderr).strip()
    tail = " | ".join(output.splitlines()[-3:])
    if "unsupported" in output and ("GNU version" in output or "compiler" in output):
        return [f"nvcc rejects the host compiler: {tail}. Fix: install a gcc/g++ this CUDA supports (conda: "
                "gxx of a supported version) and point nvcc at it with NVCC_CCBIN or CC/CXX."]
    return [f"nvcc could not compile a one-line CUDA program ({' '.join(command)}): {tail}. Fix: check the CUDA "
            "toolkit install and the host compiler."]
