"""build_and_verify: source check -> key -> cache or (preflight, patch, compile, publish) -> install -> verify.

build_only stops after the cache: the compile, which needs no GPU.

shell=True builds the same pinned source the way the articles warn against (issue 38): without --cpp_ext/--cuda_ext,
Python only, "an empty shell". It is cached and recorded like the full build (its flags, [], are in the key, so it
never shares an entry with it), and its record says "shell": true with each extension it lacks and apex's own import
error for it. The full build refuses an entry that is a shell (require_full).

settings["extensions"] (issue 40; the rules pass amprepro.apexexts.run_extensions of the run matrix): the full build
compiles only these, through the keep-extensions patch (patches.py), and promises, verifies and records exactly them;
the others are recorded as left out. Absent or None: every extension the core flags add, as before. The set is in the
cache key, so a build of fewer extensions never serves a run that needs more.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amprepro import apexexts
from amprepro.env.apexbuild import patches
from amprepro.env.apexbuild.build import pip_wheel_command, plan_build, require_extensions, run_build, wheel_extensions
from amprepro.env.apexbuild.errors import ApexError
from amprepro.env.apexbuild.install import install
from amprepro.env.apexbuild.preflight import preflight
from amprepro.env.apexbuild.setup_inspect import SetupFacts, inspect_setup
from amprepro.env.apexbuild.source import Source, file_sha256, resolve
from amprepro.env.apexbuild.store import Store, cache_key
from amprepro.env.apexbuild.toolchain import Toolchain, gpu_identity, survey
from amprepro.env.apexbuild.verify import require_ok, verify
from amprepro.files import write_json

RESULTS_DIR = Path("results/apex")


@dataclass
class Located:
    """A source, what its setup.py offers, and the cache entry holding its build for this machine's toolchain."""

    store: Store
    source: Source
    setup: SetupFacts
    promised: list[str]
    key: str
    entry: Path
    cache: str
    tools: Toolchain
    absent: list[str]  # what the full build would add and this one lacks: [] except for a shell
    left_out: list[str]  # what the core flags add and the selection (settings["extensions"]) leaves out


def locate(settings: dict, jobs: int, results: Path, env: dict, echo, shell: bool = False) -> Located:
    """Source check -> key -> the cache entry, built here on a miss (compiling needs no GPU: only nvcc and the arch)."""
    store = Store(results / "build", settings.get("cache_dir"))
    # the shell's own clone of a url source: its job may fetch while the full build's does (no shared git lock)
    source = resolve(settings.get("source") or {},
                     git_cache=store.build_root / (".git-sources-shell" if shell else ".git-sources"))
    for note in source.notes:
        echo(f"[apex] note: {note}", flush=True)
    setup = read_setup(source)
    selected = [] if shell else select(setup, settings.get("extensions"), source)
    flags = [] if shell else setup.flags_for(selected)
    left_out = [] if shell else [name for name in setup.promised(setup.core_flags()) if name not in selected]
    # the shell still needs the nvcc the full build would use where setup.py runs it whatever the flags (25.05)
    tools = survey(setup.needs_cuda(flags) or (shell and setup.nvcc_at_import), env, settings.get("cuda_arch_list"),
                   echo)
    if shell and setup.nvcc_at_import and tools.nvcc is None:
        raise ApexError(f"{source.location}'s setup.py runs `nvcc -V` even for a build without --cpp_ext/--cuda_ext "
                        f"(get_cuda_bare_metal_version(CUDA_HOME) at import), so the shell needs an nvcc too: "
                        f"{tools.nvcc_problem}")
    # the set is in the key where it is not all the flags add: a full build keeps the key it always had
    inputs = key_inputs(source, tools, flags, setup.needs_cuda(flags), selected if left_out else None)
    key = cache_key(inputs)
    found = store.find(key)
    if found is None:
        context = BuildContext(store, key, inputs, source, setup, flags, tools, settings, jobs, env, results, echo,
                               selected, left_out)
        found = build_entry(context)
    absent = list(setup.promised(setup.core_flags())) if shell else []
    return Located(store, source, setup, selected, key, found[0], found[1], tools, absent, left_out)


def select(setup: SetupFacts, wanted, source: Source) -> list[str]:
    """The extensions the full build compiles: `wanted` checked (a list of names, each a Python identifier, each one
    setup.py's core flags add), in setup.py's order; None: all of them."""
    offered = list(setup.promised(setup.core_flags()))
    if wanted is None:
        return offered
    if not isinstance(wanted, list) or not wanted:
        raise ApexError(f"apex extensions to build must be a non-empty list of names, not {wanted!r} (they come from "
                        "the run matrix: amprepro.apexexts.run_extensions).")
    for name in wanted:
        if problem := apexexts.name_problem(name):
            raise ApexError(f"apex extension {problem}.")
    unknown = [name for name in wanted if name not in offered]
    if unknown:
        raise ApexError(f"the run's cells need apex extensions {', '.join(unknown)}, which {source.location}'s "
                        f"setup.py does not build with {' '.join(setup.core_flags())} (it offers: "
                        f"{', '.join(offered)}). Fix: use apex ref 25.05, or leave those cells out of runs.")
    return [name for name in offered if name in wanted]


def build_only(settings: dict, jobs: int, results_dir: str | Path = RESULTS_DIR, env: dict | None = None,
               echo=print, shell: bool = False) -> dict:
    """The compile, without installing or verifying: the record for results/apex/build.json. It runs beside the cells
    that need no apex (workflow/rules/apex.smk); build_and_verify then finds the entry in the cache."""
    start = time.monotonic()
    found = locate(settings, jobs, Path(results_dir), dict(os.environ if env is None else env), echo, shell)
    seconds = time.monotonic() - start
    echo(f"[apex] {found.cache}: {found.key} in {seconds:.1f} s", flush=True)
    entry_manifest = json.loads((found.entry / "manifest.json").read_text())
    return {"status": "built", "key": found.key, "cache": found.cache, "commit": found.source.commit,
            "entry": str(found.entry), "seconds": round(seconds, 2), "jobs": jobs,
            "nvcc": toolkit_record(found.tools), "built_with": entry_manifest.get("cuda"), "shell": shell,
            "extensions_built": entry_manifest.get("extensions_built"), "extensions_left_out": found.left_out,
            "max_jobs": entry_manifest.get("build", {}).get("max_jobs"),
            "parallel": entry_manifest.get("build", {}).get("parallel")}


def toolkit_record(tools: Toolchain) -> dict:
    """Which nvcc this run chose and why (amprepro.env.apexbuild.cudakit): path, release, source, reason."""
    if tools.nvcc is not None:
        return tools.nvcc.describe()
    return {"nvcc": None, "release": None, "source": None,
            "reason": tools.nvcc_problem or "no CUDA extension is requested: no nvcc needed"}


def build_and_verify(settings: dict, jobs: int, results_dir: str | Path = RESULTS_DIR, env: dict | None = None,
                     echo=print, built: dict | None = None, shell: bool = False) -> dict:
    """Provide apex as configured, verified, in a site dir under results_dir; the record for apex.json. built: the
    build job's record, when one ran first (its cache status and time are this run's, not the cache hit's here)."""
    start = time.monotonic()
    env = dict(os.environ if env is None else env)
    results = Path(results_dir)
    found = locate(settings, jobs, results, env, echo, shell)
    cache = found.cache
    if built and built.get("key") == found.key and found.cache.startswith("hit"):
        cache = f"{built['cache']} by the apex_build job in {built['seconds']:.1f} s"
    manifest = json.loads((found.entry / "manifest.json").read_text())
    require_kind(manifest, found, shell)
    site = install(found.entry / manifest["wheel"]["file"], manifest["wheel"]["sha256"], results / "site" / found.key)
    verification = verify(site, found.promised, manifest["extensions_built"], found.setup.has_amp,
                          manifest["wheel"]["sha256"], gpu_identity(env), env, absent=found.absent)
    require_ok(verification, site)
    seconds = time.monotonic() - start
    echo(f"[apex] {cache}: {found.key} verified in {seconds:.1f} s; site dir {site}", flush=True)
    return {
        "status": "built",
        "required": bool(settings.get("required")),
        "reason": summary(found.source, cache, verification, seconds, shell),
        "shell": shell,
        "missing_extensions": missing_extensions(verification) if shell else {},
        "extensions_built": manifest["extensions_built"],
        "extensions_left_out": found.left_out,
        "site_dir": str(site),
        "has_amp": found.setup.has_amp,
        "commit": found.source.commit,
        "extensions": verification["extensions"],
        "verification": verification,
        "manifest": manifest,
        "settings": settings,
        "cache": {"key": found.key, "status": cache, "entry": str(found.entry),
                  "shared_root": str(found.store.shared_root or "")},
        "stage_seconds": round(seconds, 2),
        "nvcc": toolkit_record(found.tools),
        "build_job": built,
    }


def read_setup(source: Source) -> SetupFacts:
    text = source.read_text("setup.py")
    if text is None:
        raise ApexError(f"{source.location} has no setup.py at commit {source.commit[:12]}: not an apex source.")
    setup = inspect_setup(text, has_amp=source.read_text("apex/amp/__init__.py") is not None)
    if not setup.core_flags():
        raise ApexError(f"{source.location}'s setup.py offers neither --cpp_ext nor --cuda_ext extensions: "
                        "not an apex source, or one this builder does not understand.")
    return setup


def key_inputs(source: Source, tools: Toolchain, flags: list[str], compiles_cuda: bool = True,
               extensions: list[str] | None = None) -> dict:
    """compiles_cuda False (the shell): the architectures are not in the key, no kernel is compiled for them.
    extensions: what the build compiles (select) where that is fewer than its flags add; None: all they add."""
    python = tools.python
    return {
        "apex_commit": source.commit,
        "torch": python["torch"],
        "torch_git": python["torch_git"],
        "torch_cuda": python["torch_cuda"],
        "cuda": tools.nvcc.release if tools.nvcc else None,
        "python": python["soabi"] or python["python"],
        "arch_list": tools.arch_list if compiles_cuda else None,
        "flags": flags,
        **({"extensions": sorted(extensions)} if extensions else {}),
    }


@dataclass
class BuildContext:
    store: Store
    key: str
    inputs: dict
    source: Source
    setup: SetupFacts
    flags: list[str]
    tools: Toolchain
    settings: dict
    jobs: int
    env: dict
    results: Path
    echo: Callable
    selected: list[str]
    left_out: list[str]

    @property
    def log(self) -> Path:
        return self.results / "logs" / f"build-{self.key}.log"


def build_entry(ctx: BuildContext) -> tuple[Path, str]:
    with ctx.store.lock(ctx.key, ctx.echo):
        found = ctx.store.find(ctx.key)
        if found is not None:
            return found[0], "hit (built by a concurrent process while this one waited)"
        preflight(ctx.tools, ctx.setup, ctx.flags, ctx.env)
        staged = ctx.store.staging(ctx.key)
        try:
            compile_into(staged, ctx)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return ctx.store.publish(staged, ctx.key), "miss (built)"


def compile_into(staged: Path, ctx: BuildContext) -> None:
    source_dir = staged / "src"
    ctx.source.extract(source_dir)
    nvcc_release = ctx.tools.nvcc.release if ctx.tools.nvcc else None
    # what the flags add beyond the selection: deleted from setup.py (an extension of a flag not given is not built)
    dropped = [name for name in ctx.setup.promised(ctx.flags) if name not in ctx.selected]
    applied = patches.apply(patches.planned(ctx.setup, nvcc_release, dropped), source_dir, dropped)
    promised = list(ctx.selected)
    plan = plan_build(ctx.setup, ctx.flags, ctx.jobs, ctx.settings.get("build_jobs"), ctx.tools, ctx.env, promised)
    left = f"; left out (no cell uses them): {' '.join(ctx.left_out)}" if ctx.left_out else ""
    ctx.echo(f"[apex] building {ctx.source.ref or ''} {ctx.source.commit[:12]}: {len(promised)} extensions "
             f"({' '.join(promised)}; {' '.join(ctx.flags)}{left}), arch {ctx.tools.arch_list}, "
             f"--parallel {plan.parallel}, MAX_JOBS {plan.max_jobs}, patches {[p['name'] for p in applied]}; "
             f"log {ctx.log}", flush=True)
    ctx.log.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    wheel = run_build(plan, source_dir, staged / "dist", ctx.log, promised, ctx.env, ctx.echo)
    seconds = time.monotonic() - began
    built = wheel_extensions(wheel, promised)
    require_extensions(built, promised, ctx.flags, plan, ctx.log)
    if extra := wheel_extensions(wheel, ctx.left_out):  # the record would say they were left out
        raise ApexError(f"the build was to leave out {', '.join(extra)} (no cell uses them) but the wheel has them: "
                        f"the keep-extensions patch did not take. Refusing to publish it. Log: {ctx.log}")
    wheel = wheel.rename(staged / wheel.name)
    shutil.rmtree(source_dir)
    shutil.rmtree(staged / "dist")
    shutil.copyfile(ctx.log, staged / "build.log")
    write_json(staged / "manifest.json", manifest(ctx, plan, applied, promised, built, wheel, seconds))


def manifest(ctx: BuildContext, plan, applied, promised, built, wheel: Path, seconds: float) -> dict:
    python, nvcc = ctx.tools.python, ctx.tools.nvcc
    return {
        "schema": 1,
        "key": ctx.key,
        "key_inputs": ctx.inputs,
        "apex": {**ctx.source.describe(), "has_amp": ctx.setup.has_amp},
        "torch": {"version": python["torch"], "cuda": python["torch_cuda"], "git_version": python["torch_git"]},
        "cuda": None if nvcc is None else nvcc.describe(),
        "python": {"version": python["python"], "soabi": python["soabi"], "executable": python["executable"]},
        "arch_list": ctx.tools.arch_list,
        "arch_source": ctx.tools.arch_source,
        "flags": ctx.flags,
        "build": {
            "command": shlex.join(pip_wheel_command(plan, Path("src"), Path("dist"))),
            "setup_py_options": plan.options,
            "env": plan.env,
            "parallel": plan.parallel,
            "max_jobs": plan.max_jobs,
            "jobs": ctx.jobs,
            "host": platform.node(),
            "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
        "shell": not ctx.flags,
        "patches": applied,
        "extensions_promised": promised,
        "extensions_built": built,
        "extensions_left_out": ctx.left_out,
        "wheel": {"file": wheel.name, "sha256": file_sha256(wheel), "bytes": wheel.stat().st_size},
        "build_seconds": round(seconds, 1),
    }


def require_kind(manifest: dict, found: Located, shell: bool) -> None:
    """The entry is what was asked for: a full build never runs from a shell's entry (nor the other way round). The
    key holds the flags, so only a copied or edited entry gets here; checked anyway, since a shell passes every
    import of a build that promises nothing."""
    flags = list(manifest.get("flags") or [])
    is_shell = bool(manifest.get("shell")) or not flags
    if is_shell == shell:
        return
    wanted = "a shell (Python only)" if shell else f"the full build ({' '.join(found.setup.core_flags())})"
    raise ApexError(f"the apex cache entry {found.entry} was built with flags {flags or 'none'}"
                    f"{' (an empty shell: no compiled extension)' if is_shell else ''}, but {wanted} was asked for. "
                    f"Fix: delete {found.entry} so that it is rebuilt.")


def missing_extensions(verification: dict) -> dict:
    """Each extension a shell lacks, with apex's own import error for it (verify_probe's "absent" check)."""
    return {name: info.get("error") for name, info in verification["checks"].get("absent", {}).get(
        "extensions", {}).items()}


def summary(source: Source, cache: str, verification: dict, seconds: float, shell: bool = False) -> str:
    extensions = verification["extensions"]
    importable = sum(info["importable"] for info in extensions.values())
    passed = [name for name, result in verification["checks"].items() if result.get("ok")]
    skipped = [name for name, result in verification["checks"].items() if result.get("ok") is None]
    text = (f"apex {source.ref or source.kind} ({source.commit[:12]}) {cache} in {seconds:.1f} s: "
            f"{importable}/{len(extensions)} extensions importable; checks passed: {', '.join(passed)}")
    if shell:
        absent = missing_extensions(verification)
        text = (f"an empty shell, built without --cpp_ext/--cuda_ext (Python only; {len(absent)} extensions missing: "
                f"{', '.join(absent)}): " + text)
    if verification["gpu"]:
        text += f" on {verification['gpu']}"
    if skipped:
        text += f"; skipped (no CUDA device): {', '.join(skipped)}"
    return text
