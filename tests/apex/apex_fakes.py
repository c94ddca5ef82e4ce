"""Helpers for the apex build tests: the fake_apex source in a git repo and fake toolchains.

Nothing here needs a GPU, nvcc or the network: CUDA tools are shell scripts written into tmp dirs, and a fake
`torch` package on PYTHONPATH stands in for a CUDA build of torch where a test needs one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_APEX = REPO / "tests" / "fixtures" / "fake_apex"
GIT_IDENTITY = ["-c", "user.name=amprepro tests", "-c", "user.email=tests@amprepro.invalid",
                "-c", "commit.gpgsign=false"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_IDENTITY, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def make_repo(source: Path, dest: Path) -> str:
    """Copy source into a new git repo at dest, commit it, return the commit."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    git(dest, "init", "--quiet")
    git(dest, "add", "-A")
    git(dest, "commit", "--quiet", "-m", "fixture")
    return git(dest, "rev-parse", "HEAD")


def settings_for(path: Path, commit: str, cache_dir: Path | None = None, **source) -> dict:
    return {"required": True, "source": {"path": str(path), "commit": commit, "ref": "fixture", **source},
            "cuda_arch_list": None, "cache_dir": str(cache_dir) if cache_dir else None, "build_jobs": None}


class Echo:
    """Collects the progress lines build_and_verify prints."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str, **_):
        self.lines.append(line)


@dataclass
class Built:
    settings: dict
    record: dict
    results: Path
    cache: Path
    echo: Echo
    seconds: float
    commit: str
    repo: Path
    env: dict | None = None  # the environment of the compile (the pip route's, conftest.pip_route_env)

    @property
    def key(self) -> str:
        return self.record["cache"]["key"]


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def fake_cuda(home: Path, release: str = "13.0", archs: str = "compute_75 compute_80 compute_90 compute_100",
              compile_error: str | None = None, headers: bool = True) -> Path:
    """A CUDA toolkit root whose nvcc is a script: --version, --list-gpu-arch, and a compile that passes or fails."""
    compile_step = f"echo '{compile_error}' >&2; exit 1" if compile_error else "exit 0"
    write_script(home / "bin" / "nvcc", f"""case "$1" in
  --version) echo "Cuda compilation tools, release {release}, V{release}.41"; exit 0;;
  --list-gpu-arch) for a in {archs}; do echo $a; done; exit 0;;
esac
{compile_step}
""")
    if headers:
        (home / "include").mkdir(parents=True, exist_ok=True)
        (home / "include" / "cuda_runtime.h").write_text("/* fake */\n")
    return home


def fake_nvidia_smi(bin_dir: Path, compute_caps: list[str]) -> Path:
    lines = "\n".join(compute_caps)
    return write_script(bin_dir / "nvidia-smi", f"""case "$1" in
  --query-gpu=compute_cap) printf '{lines}\\n';;
  *) echo "NVIDIA H200, GPU-fake-uuid, 580.00";;
esac
""")


def fake_python_packages(root: Path, torch_cuda: str | None = "13.0", ninja: bool = True,
                         torch_import_error: str | None = None) -> Path:
    """A directory for PYTHONPATH holding a stand-in torch (version.py + cpp_extension) built for torch_cuda."""
    torch_dir = root / "torch"
    (torch_dir / "utils").mkdir(parents=True)
    init = "from .version import __version__, cuda\nfrom . import version\n"
    if torch_import_error:
        init = f"raise ImportError({torch_import_error!r})\n"
    (torch_dir / "__init__.py").write_text(init)
    (torch_dir / "version.py").write_text(f"__version__ = '2.11.0+fake'\ncuda = {torch_cuda!r}\ngit_version = 'fake'\n")
    (torch_dir / "utils" / "__init__.py").write_text("")
    (torch_dir / "utils" / "cpp_extension.py").write_text(f"def is_ninja_available():\n    return {ninja}\n")
    return root


def fake_distribution(root: Path, name: str, version: str, summary: str) -> Path:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n")
    return root


def python_env(env: dict, *paths: Path) -> dict:
    return {**env, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}


def run_module(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**(env or os.environ), "PYTHONPATH": str(REPO / "workflow")}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


# The components cuda-toolkit 13.0.2 maps its extras to (its METADATA, read with pip download on 2026-12-01).
CUDA_TOOLKIT_EXTRAS = {"nvcc": "nvidia-cuda-nvcc", "crt": "nvidia-cuda-crt", "nvvm": "nvidia-nvvm",
                       "cudart": "nvidia-cuda-runtime", "cccl": "nvidia-cuda-cccl",
                       "profiler": "nvidia-cuda-profiler-api"}


def make_wheel(wheel_dir: Path, name: str, version: str, files: dict[str, tuple[str, int]] | None = None,
               metadata: str = "") -> Path:
    """A minimal wheel pip installs: files {path: (text, mode)}, extra METADATA lines (Requires-Dist, ...)."""
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    path = wheel_dir / f"{dist}-py3-none-any.whl"
    entries = dict(files or {})
    entries[f"{dist}.dist-info/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}",
                                              0o644)
    entries[f"{dist}.dist-info/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: amprepro-tests\nRoot-Is-Purelib: true\n"
                                           "Tag: py3-none-any\n", 0o644)
    record = "".join(f"{name},,\n" for name in entries) + f"{dist}.dist-info/RECORD,,\n"
    entries[f"{dist}.dist-info/RECORD"] = (record, 0o644)
    with zipfile.ZipFile(path, "w") as archive:
        for member, (text, mode) in entries.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = (0o100000 | mode) << 16
            archive.writestr(info, text)
    return path


def fake_cuda_wheels(wheel_dir: Path, requirements: Path, release: str = "13.0") -> Path:
    """Wheels with the names, versions and extras the requirements file pins, holding a fake nvcc (a script, see
    fake_cuda), cuda_runtime.h and libcudart.so.<major>: enough for pip --no-index to resolve and install them."""
    pins = dict(line.split("==") for line in requirements.read_text().splitlines()
                if line and not line.startswith("#") and "==" in line)
    meta_version = next(version for name, version in pins.items() if name.startswith("cuda-toolkit["))
    major = release.split(".")[0]
    files = {
        "nvidia-cuda-nvcc": {f"nvidia/cu{major}/bin/nvcc": (f"""#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release {release}, V{release}.88"; exit 0;;
  --list-gpu-arch) for a in compute_75 compute_80 compute_90; do echo $a; done; exit 0;;
esac
exit 0
""", 0o755)},
        "nvidia-cuda-runtime": {f"nvidia/cu{major}/include/cuda_runtime.h": ("/* fake */\n", 0o644),
                                f"nvidia/cu{major}/lib/libcudart.so.{major}": ("not a library\n", 0o644)},
    }
    metadata = ""
    for extra, component in CUDA_TOOLKIT_EXTRAS.items():
        make_wheel(wheel_dir, component, pins[component], files.get(component, {
            f"nvidia/cu{major}/include/{component}.h": ("/* fake */\n", 0o644)}))
        metadata += (f"Provides-Extra: {extra}\nRequires-Dist: {component}=={pins[component]}.*; "
                     f"extra == '{extra}'\n")
    make_wheel(wheel_dir, "cuda-toolkit", meta_version, metadata=metadata)
    return wheel_dir
