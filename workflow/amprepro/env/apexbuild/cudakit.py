"""Which nvcc compiles apex: a system toolkit whose release equals torch.version.cuda, else NVIDIA's pip packages.

    system  nvcc found the way torch finds it (CUDA_HOME/CUDA_PATH, PATH, $CONDA_PREFIX/bin, /usr/local/cuda), used
            when its release equals torch's CUDA release (apex 25.05 demands equality). An activated conda env's
            cuda-nvcc (envs/train-gpu.yaml) is found this way too.
    pip     the `cuda-toolkit` extras pinned in requirements-cuda<release>.txt (repository root), installed with
            `pip install --target` into <env>/amprepro-cuda/<release>-<hash>/ inside the env that builds (make run's
            .venv), never outside it; CUDA_HOME=<that>/nvidia/cu13, its bin first on PATH, a libcudart.so link beside
            the shipped libcudart.so.13, and CPATH += torch's own site-packages/nvidia/cu13/include (cusparse.h,
            cublas_v2.h, ... that torch's headers include ship with torch's CUDA wheels).

AMPREPRO_NVCC=system|pip forces one. pip honours PIP_INDEX_URL / PIP_FIND_LINKS / PIP_NO_INDEX, so a machine without
network installs from carried wheels. The install is atomic (a temporary directory renamed into place once nvcc in it
reports the pinned release) and serialized by an flock, so two builders never see half a toolkit.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from amprepro.env.apexbuild.errors import ApexError

REPO = Path(__file__).resolve().parents[4]
FORCE_VARIABLE = "AMPREPRO_NVCC"
CHOICES = ("system", "pip")
RELEASE = re.compile(r"[0-9]+\.[0-9]+")
PIN = re.compile(r"^cuda-toolkit\[([a-z,_-]+)\]==([0-9][0-9.]*)\s*$")
MARKER = ".amprepro-cuda.json"
INSTALL_DIR = "amprepro-cuda"


@dataclass(frozen=True)
class Nvcc:
    path: str
    cuda_home: str
    found_via: str
    release: str | None  # "13.0"; None when `nvcc --version` failed
    source: str = "system"  # "system" (a toolkit found on this machine) or "pip" (cuda-toolkit wheels in the env)
    reason: str = ""  # why this nvcc was chosen
    env: dict = field(default_factory=dict)  # what the build's environment gets on top of the caller's

    def describe(self) -> dict:
        return {"nvcc": self.path, "release": self.release, "cuda_home": self.cuda_home, "source": self.source,
                "found_via": self.found_via, "reason": self.reason, "env": self.env}


def forced(env: dict) -> str | None:
    value = env.get(FORCE_VARIABLE, "")
    if value == "":
        return None
    if value not in CHOICES:
        raise ApexError(f"{FORCE_VARIABLE}={value!r} is not one of {', '.join(CHOICES)}. Fix: unset it (the matching "
                        "system nvcc, else pip's), or set system or pip.")
    return value


def requirements_file(torch_cuda: str, root: Path = REPO) -> Path:
    if not RELEASE.fullmatch(torch_cuda or ""):
        raise ApexError(f"torch.version.cuda {torch_cuda!r} is not a CUDA release like 13.0.")
    return root / f"requirements-cuda{torch_cuda}.txt"


def pip_route_hint(torch_cuda: str | None, env: dict) -> str:
    """The pip route as a fix, for the preflight's and sanity's messages."""
    if not torch_cuda or not RELEASE.fullmatch(torch_cuda):
        return "a CUDA build of torch first"
    name = f"requirements-cuda{torch_cuda}.txt"
    if not (REPO / name).is_file():
        return f"or add a pinned pip toolkit for CUDA {torch_cuda} (the repository has no {name})"
    how = (f"unset {FORCE_VARIABLE} (now {env[FORCE_VARIABLE]})" if env.get(FORCE_VARIABLE) == "system"
           else f"set {FORCE_VARIABLE}=pip")
    return (f"or let the apex build install nvcc {torch_cuda} from pip into the env ({name}: automatic when no "
            f"matching nvcc is found; {how}; offline: PIP_NO_INDEX=1 PIP_FIND_LINKS=<dir of its wheels>)")


@dataclass(frozen=True)
class Decision:
    route: str | None  # "system", "pip", or None: no nvcc can be had
    reason: str  # why; with route None, the problem and its fix
    system: Nvcc | None
    requirements: Path | None = None  # the pip route's pins


def decide(env: dict, torch_cuda: str | None, system: Nvcc | None, system_problem: str | None) -> Decision:
    """Which route, without installing anything (sanity asks this too)."""
    force = forced(env)
    if force == "system":
        if system is None:
            return Decision(None, f"{FORCE_VARIABLE}=system, but {system_problem}, "
                                  f"{pip_route_hint(torch_cuda, env)}.", None)
        return Decision("system", f"{FORCE_VARIABLE}=system", system)
    if force == "pip":
        return Decision("pip", f"{FORCE_VARIABLE}=pip", system, pip_requirements(torch_cuda, f"{FORCE_VARIABLE}=pip"))
    configured = next((variable for variable in ("CUDA_HOME", "CUDA_PATH") if env.get(variable)), None)
    if system is None and configured:  # set by hand to something that is no toolkit: not overruled silently
        return Decision(None, f"{system_problem}, {pip_route_hint(torch_cuda, env)}.", None)
    if system is not None and system.release is None and configured:  # a broken toolkit set by hand: reported
        return Decision("system", f"{configured} names it, but it prints no release", system)
    if torch_cuda is None:  # a CPU torch: the preflight says that, whatever nvcc there is
        if system is None:
            return Decision(None, f"{system_problem}.", None)
        return Decision("system", "torch has no CUDA release to match", system)
    if system is not None and system.release == torch_cuda:
        return Decision("system", f"nvcc {system.release} ({system.found_via}) matches torch's CUDA {torch_cuda}",
                        system)
    why = (f"nvcc {system.release} at {system.path} ({system.found_via}) does not match torch's CUDA {torch_cuda}"
           if system is not None else "no nvcc on this machine (CUDA_HOME, PATH, $CONDA_PREFIX/bin, /usr/local/cuda)")
    if not requirements_file(torch_cuda).is_file():  # no pip route: the preflight reports what there is
        if system is None:
            return Decision(None, f"{system_problem}, {pip_route_hint(torch_cuda, env)}.", None)
        return Decision("system", f"{why}; no pinned pip toolkit for it", system)
    return Decision("pip", why, system, requirements_file(torch_cuda))


def choose(env: dict, torch_cuda: str | None, system: Nvcc | None, system_problem: str | None,
           prefix: Path | None = None, torch_site: str | None = None, echo=print) -> tuple[Nvcc | None, str | None]:
    """The nvcc the build uses (or None and the problem), with the reason in Nvcc.reason. Installs the pip toolkit
    when it is chosen and not yet in the env (prefix: that env; default: the running interpreter's). torch_site: the
    site-packages holding the building interpreter's torch (its CUDA wheels' headers are there)."""
    decision = decide(env, torch_cuda, system, system_problem)
    if decision.route is None:
        return None, decision.reason
    if decision.route == "system":
        return with_reason(decision.system, decision.reason), None
    home = ensure_installed(decision.requirements, torch_cuda, prefix or env_prefix(env), env, echo)
    nvcc, name = home / "bin" / "nvcc", decision.requirements.name
    return Nvcc(str(nvcc), str(home), f"pip ({name})", nvcc_release(str(nvcc)), "pip",
                f"{decision.reason}: nvcc from pip ({name})", build_env(home, env, torch_site)), None


def installed_home(requirements: Path, prefix: Path) -> Path | None:
    """CUDA_HOME of the pip toolkit already in the env, or None."""
    _, version = parse_pin(requirements)
    marker = Path(prefix) / INSTALL_DIR / f"{version}-{pin_digest(requirements)}" / MARKER
    return Path(json.loads(marker.read_text())["cuda_home"]) if marker.is_file() else None


def pin_digest(requirements: Path) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]


def with_reason(nvcc: Nvcc, reason: str) -> Nvcc:
    return Nvcc(nvcc.path, nvcc.cuda_home, nvcc.found_via, nvcc.release, nvcc.source, reason, nvcc.env)


def pip_requirements(torch_cuda: str | None, why: str) -> Path:
    if torch_cuda is None:
        raise ApexError(f"{why}: the pip toolkit is pinned to torch's CUDA release, but torch has none (a CPU "
                        "build). Fix: install a CUDA build of torch, or unset AMPREPRO_NVCC.")
    requirements = requirements_file(torch_cuda)
    if not requirements.is_file():
        raise ApexError(f"{why}, but there is no pinned pip toolkit for torch's CUDA {torch_cuda}: {requirements} "
                        "does not exist. Fix: install the matching CUDA toolkit (or conda's cuda-nvcc) and set "
                        "CUDA_HOME, or add that requirements file.")
    return requirements


def parse_pin(requirements: Path) -> tuple[list[str], str]:
    """The extras and the version of the one `cuda-toolkit[...]==X` line."""
    pins = [PIN.match(line.strip()) for line in requirements.read_text().splitlines()
            if line.strip().startswith("cuda-toolkit")]
    if len(pins) != 1 or pins[0] is None:
        raise ApexError(f"{requirements} must pin exactly one `cuda-toolkit[extra,...]==VERSION` line. Fix: restore "
                        "it from git.")
    return pins[0].group(1).split(","), pins[0].group(2)


def env_prefix(env: dict) -> Path:
    """The env that builds: a venv (make run's .venv) or a conda env. A system Python gets nothing written into it."""
    prefix = Path(sys.prefix)
    if sys.prefix == sys.base_prefix and env.get("CONDA_PREFIX") != sys.prefix:
        raise ApexError(f"the pip route installs nvcc into the env that builds, but {sys.executable} is not in a "
                        f"venv or conda env (prefix {sys.prefix}), and nothing is written outside one. Fix: run "
                        "through `make run` (its .venv), or set CUDA_HOME to a toolkit matching torch.version.cuda.")
    return prefix


def ensure_installed(requirements: Path, torch_cuda: str, prefix: Path, env: dict, echo=print) -> Path:
    """CUDA_HOME of the pinned pip toolkit in the env, installed first when missing."""
    extras, version = parse_pin(requirements)
    root = Path(prefix) / INSTALL_DIR
    target = root / f"{version}-{pin_digest(requirements)}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MARKER).is_file():
            return Path(json.loads((target / MARKER).read_text())["cuda_home"])
        echo(f"[apex] installing nvcc {torch_cuda} from pip into {target} (cuda-toolkit[{','.join(extras)}]"
             f"=={version}, {requirements.name})", flush=True)
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the toolkit from other users of the env
        try:
            home = install_into(staging, requirements, torch_cuda, env)
            write_marker(staging, requirements, version, torch_cuda, target / home.relative_to(staging))
            if target.exists():  # a directory without a marker: an interrupted install of older code
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return Path(json.loads((target / MARKER).read_text())["cuda_home"])


def install_into(staging: Path, requirements: Path, torch_cuda: str, env: dict) -> Path:
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
               "--target", str(staging), "--requirement", str(requirements)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-4:])
        raise ApexError(f"installing nvcc from pip failed ({' '.join(command)}): {tail}. Fix: check the network "
                        "or PyPI index (PIP_INDEX_URL); on a machine without network download the wheels elsewhere "
                        "(`pip download -r <that file>`) and set PIP_NO_INDEX=1 PIP_FIND_LINKS=<their dir>.")
    homes = sorted(staging.glob("nvidia/*/bin/nvcc"))
    if len(homes) != 1:
        raise ApexError(f"{requirements.name} installed {len(homes)} nvcc (nvidia/*/bin/nvcc) into {staging}; "
                        "expected one. Fix: check the pins of that file.")
    home = homes[0].parent.parent
    link_cudart(home)
    release = nvcc_release(str(homes[0]))
    if release != torch_cuda:
        raise ApexError(f"the nvcc that {requirements.name} installed reports release {release}, not torch's "
                        f"{torch_cuda}. Fix: pin the cuda-toolkit version of CUDA {torch_cuda} in that file.")
    for needed in ("include/cuda_runtime.h", "lib/libcudart.so"):
        if not (home / needed).exists():
            raise ApexError(f"{requirements.name} left no {needed} in {home}; the extras must include cudart. "
                            "Fix: restore the file from git.")
    return home


def link_cudart(home: Path) -> None:
    """`-lcudart` needs libcudart.so; the wheel ships only libcudart.so.<major>."""
    lib = home / "lib"
    shipped = sorted(p.name for p in lib.glob("libcudart.so.*") if re.fullmatch(r"libcudart\.so\.[0-9]+", p.name))
    if shipped and not (lib / "libcudart.so").exists():
        (lib / "libcudart.so").symlink_to(shipped[-1])


def write_marker(staging: Path, requirements: Path, version: str, torch_cuda: str, home: Path) -> None:
    """Written last: a directory counts as installed only with it. home: CUDA_HOME once renamed into place."""
    dists = sorted(p.name.removesuffix(".dist-info") for p in staging.glob("*.dist-info"))
    record = {"requirements": requirements.name, "requirements_text": requirements.read_text(),
              "cuda_toolkit": version, "release": torch_cuda, "installed": dists, "cuda_home": str(home)}
    (staging / MARKER).write_text(json.dumps(record, indent=1) + "\n")


def torch_include(torch_site: str | None) -> list[str]:
    """Headers of torch's own CUDA wheels (cusparse, cublas, ...), which torch's CUDA headers include."""
    if not torch_site:
        return []
    return [str(path) for path in sorted(Path(torch_site).glob("nvidia/cu*/include")) if path.is_dir()]


def build_env(home: Path, env: dict, torch_site: str | None) -> dict:
    paths = [str(home / "bin")] + [p for p in env.get("PATH", "").split(os.pathsep) if p]
    out = {"CUDA_HOME": str(home), "PATH": os.pathsep.join(paths)}
    include = torch_include(torch_site)
    if include:
        out["CPATH"] = os.pathsep.join(include + [p for p in env.get("CPATH", "").split(os.pathsep) if p])
    return out


def nvcc_release(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None
