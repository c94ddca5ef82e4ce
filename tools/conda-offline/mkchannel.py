"""Build a local file:// conda channel for the offline `--use-conda` test. Test tooling, not a package builder.

Two kinds of package, written in the .conda format (zip of zstd tarballs) and indexed with py-rattler:

* python: a copy of a local CPython install (e.g. pyenv's 3.11), made relocatable: ELF RUNPATHs become
  $ORIGIN-relative and text files that name the old prefix get conda's prefix placeholder, which the installer
  replaces with the env path. site-packages starts empty, so an env sees only the packages installed into it.
  With --probe, site-packages also gets a .pth hook that appends one JSON line per interpreter start to
  $AMPREPRO_PROBE_LOG (when set): test instrumentation that shows which interpreter each job ran in.
* one package per installed Python distribution of a donor environment (the project's .venv), repackaged from its
  RECORD under conda-forge's name for it (torch -> pytorch, ...). Only the dependency closure of the requested names
  is built. Dependencies come from the distributions' Requires-Dist (markers evaluated for CPython 3.11 on Linux),
  so the solver resolves a real dependency graph. A local version label becomes the build string
  (torch 2.13.0+cpu -> pytorch 2.13.0 cpu_pypi_0) so that env files may select `pytorch=2.13.0=cpu_*`.

Usage: mkchannel.py CHANNEL_DIR --python-prefix PREFIX --site-packages SITE [--probe] NAME [NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import zstandard
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PLACEHOLDER = b"/opt/anaconda1anaconda2anaconda3"  # conda's classic prefix placeholder
SUBDIR = "linux-64"
# PyPI name -> conda-forge name, where they differ (for the packages the env files name and their dependencies)
CONDA_NAMES = {"torch": "pytorch", "matplotlib": "matplotlib-base", "nbconvert": "nbconvert-core",
               "jupyter-client": "jupyter_client", "jupyter-core": "jupyter_core",
               "typing-extensions": "typing_extensions", "stack-data": "stack_data", "pure-eval": "pure_eval"}
PROBE_MODULE = '''"""Test instrumentation of the offline test channel's python
(tools/conda-offline/mkchannel.py --probe). When AMPREPRO_PROBE_LOG is set, every interpreter start appends one JSON
line: which python, which env, which command."""
import json, os, sys
_log = os.environ.get("AMPREPRO_PROBE_LOG")
if _log:
    import importlib.util
    _line = json.dumps({"pid": os.getpid(), "argv": getattr(sys, "orig_argv", sys.argv), "prefix": sys.prefix,
                        "executable": sys.executable, "conda_prefix": os.environ.get("CONDA_PREFIX"),
                        "cwd": os.getcwd(), "snakemake_importable": importlib.util.find_spec("snakemake") is not None})
    with open(_log, "a") as _f:
        _f.write(_line + "\\n")
'''


def conda_name(pypi_name: str) -> str:
    name = canonicalize_name(pypi_name)
    return CONDA_NAMES.get(name, name)


def is_elf(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


# ------------------------------------------------------------------------------------------------ package writer
def write_conda(files: dict[str, Path | bytes], channel: Path, index: dict) -> Path:
    """Write <channel>/<subdir>/<name>-<version>-<build>.conda holding `files` (path in the env -> source file or
    content). Files that contain the placeholder are registered for prefix replacement at install time."""
    entries = []
    for rel, source in sorted(files.items()):
        if isinstance(source, Path) and source.is_symlink():
            entries.append({"_path": rel, "path_type": "softlink"})
            continue
        data = source if isinstance(source, bytes) else source.read_bytes()
        entry = {"_path": rel, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
                 "size_in_bytes": len(data)}
        if PLACEHOLDER in data:
            entry.update(prefix_placeholder=PLACEHOLDER.decode(), file_mode="text")
        entries.append(entry)
    index = {"build_number": 0, "depends": [], "license": "see upstream", "subdir": SUBDIR, "platform": "linux",
             "arch": "x86_64", "timestamp": int(time.time() * 1000), **index}
    info = {"info/index.json": json.dumps(index, indent=1).encode(),
            "info/paths.json": json.dumps({"paths": entries, "paths_version": 1}, indent=1).encode(),
            "info/files": "".join(e["_path"] + "\n" for e in entries).encode()}
    stem = f"{index['name']}-{index['version']}-{index['build']}"
    target = channel / SUBDIR / f"{stem}.conda"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        info_tar, pkg_tar = Path(tmp) / f"info-{stem}.tar.zst", Path(tmp) / f"pkg-{stem}.tar.zst"
        with _zstd_tar(info_tar) as tar:
            for name, data in info.items():
                _add_bytes(tar, name, data, 0o644)
        with _zstd_tar(pkg_tar) as tar:
            for rel, source in sorted(files.items()):
                if isinstance(source, bytes):
                    _add_bytes(tar, rel, source, 0o755 if source.startswith(b"#!") else 0o644)
                else:
                    tar.add(source, arcname=rel, recursive=False)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
            archive.write(pkg_tar, pkg_tar.name)
            archive.write(info_tar, info_tar.name)
    print(f"  {target.name}: {len(entries)} files, {target.stat().st_size / 1e6:.1f} MB", flush=True)
    return target


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    member = tarfile.TarInfo(name)
    member.size, member.mode, member.mtime = len(data), mode, int(time.time())
    tar.addfile(member, io.BytesIO(data))


def tree(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}


@contextlib.contextmanager
def _zstd_tar(path: Path):
    """tarfile writing through a zstd stream: `with _zstd_tar(path) as tar: tar.add(...)`."""
    with (open(path, "wb") as handle,
          zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(handle) as stream,
          tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar):
        yield tar


# ---------------------------------------------------------------------------------------------------------- python
def stage_python(source: Path, stage: Path, probe: bool) -> tuple[str, str]:
    version = subprocess.check_output([str(source / "bin" / "python3"), "-c",
                                       "import sys; print('%d.%d.%d' % sys.version_info[:3])"], text=True).strip()
    short = version.rsplit(".", 1)[0]
    (stage / "bin").mkdir(parents=True)
    for name in (f"python{short}", "python3", "python", f"python{short}-config", "python3-config"):
        if (source / "bin" / name).exists():
            shutil.copy2(source / "bin" / name, stage / "bin" / name, follow_symlinks=False)
    if not (stage / "bin" / "python").exists():
        os.symlink(f"python{short}", stage / "bin" / "python")
    skip = {"test", "tests", "idle_test", "__pycache__", "site-packages"}
    for part in ("include", "lib"):
        shutil.copytree(source / part, stage / part, symlinks=True,
                        ignore=lambda _, names: [n for n in names if n in skip or n.endswith((".a", ".pyc"))])
    site = stage / "lib" / f"python{short}" / "site-packages"
    site.mkdir()
    if probe:
        (site / "_amprepro_probe.py").write_text(PROBE_MODULE)
        (site / "_amprepro_probe.pth").write_text("import _amprepro_probe\n")
    patchelf = shutil.which("patchelf") or str(Path(sys.executable).parent / "patchelf")
    old = str(source).encode()
    for path in (p for p in stage.rglob("*") if p.is_file() and not p.is_symlink()):
        if is_elf(path):
            rpath = subprocess.run([patchelf, "--print-rpath", str(path)], capture_output=True, text=True).stdout
            if str(source) in rpath:
                rpath_here = f"$ORIGIN/{os.path.relpath(stage / 'lib', path.parent)}"
                subprocess.check_call([patchelf, "--set-rpath", rpath_here, str(path)])
            continue
        data = path.read_bytes()
        if old in data and b"\0" not in data:
            path.write_bytes(data.replace(old, PLACEHOLDER))
    return version, short


# ---------------------------------------------------------------------------------------------------- distributions
def closure(roots: list[str], dists: dict[str, importlib.metadata.Distribution]) -> list[str]:
    """Conda names of the roots and everything they need, by Requires-Dist."""
    todo, seen = list(roots), []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in dists:
            raise SystemExit(f"mkchannel: {name} is needed but not installed in the donor environment")
        seen.append(name)
        todo += requirements(dists[name], dists)
    return sorted(seen)


TARGET = default_environment()  # marker environment of the packaged python; main() sets its version


def requirements(dist, dists, extras: frozenset[str] = frozenset()) -> list[str]:
    """Conda names `dist` depends on (with `extras` requested). A requirement with extras, like nbconvert's
    bleach[css], also brings the packages of those extras, since conda packages have no extras."""
    found = set()
    for text in dist.requires or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({**TARGET, "extra": e}) for e in {"", *extras}):
            name = conda_name(requirement.name)
            found.add(name)
            if requirement.extras and name in dists:
                found.update(requirements(dists[name], dists, frozenset(requirement.extras)))
    return sorted(found - {conda_name(dist.metadata["Name"])})


def dist_files(dist: importlib.metadata.Distribution, donor_prefix: Path, short: str) -> dict[str, Path | bytes]:
    """The files of an installed distribution (its RECORD), keyed by their path in a conda env."""
    site = Path(dist.locate_file(""))
    files: dict[str, Path | bytes] = {}
    for file in dist.files or []:
        source = site / file
        rel = os.path.normpath(os.path.join("lib", f"python{short}", "site-packages", str(file)))
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith((".pyc", "direct_url.json")):
            continue
        if not (source.exists() or source.is_symlink()):
            continue
        files[rel] = source
        if rel.endswith(".dist-info/INSTALLER"):
            files[rel] = b"conda\n"
        elif rel.startswith("bin/") and not source.is_symlink():  # console scripts: the shebang names the donor
            data = source.read_bytes()
            if str(donor_prefix).encode() in data and b"\0" not in data:
                files[rel] = data.replace(str(donor_prefix).encode(), PLACEHOLDER)
    return files


def version_and_build(dist) -> tuple[str, str]:
    version, _, local = dist.version.partition("+")
    return version, f"{re.sub(r'[^A-Za-z0-9]', '', local)}_pypi_0" if local else "pypi_0"


# ------------------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("channel", type=Path)
    parser.add_argument("--python-prefix", type=Path, required=True, help="CPython install to package as python")
    parser.add_argument("--site-packages", type=Path, required=True, help="donor environment's site-packages")
    parser.add_argument("--probe", action="store_true", help="add the AMPREPRO_PROBE_LOG hook to python")
    parser.add_argument("names", nargs="*", help="conda names to provide, with their dependency closure")
    args = parser.parse_intermixed_args(argv)
    channel = args.channel.resolve()
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    dists = {conda_name(d.metadata["Name"]): d
             for d in importlib.metadata.distributions(path=[str(args.site_packages)])}
    donor_prefix = args.site_packages.resolve().parent.parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        version, short = stage_python(args.python_prefix.resolve(), Path(tmp) / "python", args.probe)
        TARGET.update(python_version=short, python_full_version=version)
        write_conda(tree(Path(tmp) / "python"), channel,
                    {"name": "python", "version": version, "build": "local_cpython_0"})
        python_dep = f"python >={short},<{short.split('.')[0]}.{int(short.split('.')[1]) + 1}.0a0"
        for name in closure([n for n in args.names if n != "python"], dists):
            pkg_version, build = version_and_build(dists[name])
            write_conda(dist_files(dists[name], donor_prefix, short), channel,
                        {"name": name, "version": pkg_version, "build": build,
                         "depends": [python_dep, *requirements(dists[name], dists)]})

    from rattler.index import index_fs

    asyncio.run(index_fs(channel, write_zst=False, write_shards=False, force=True))
    print(f"mkchannel: {channel} indexed in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip finalization: py-rattler's native runtime can segfault at interpreter teardown
