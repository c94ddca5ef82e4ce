"""Compile the wheel: the flags right for the ref, a full log, a line per extension and a heartbeat while nvcc works.

Flags go to setup.py through ONE `--config-settings=--build-option=<all options>`: setuptools shlex-splits a single
string, while repeated --config-settings reach it as a list whose items are not split, so "--parallel 12" would
arrive as one unknown option. 25.05 reads flags only from sys.argv (its README's APEX_* variables came in 25.09);
refs that know the variables get them too.
"""

from __future__ import annotations

import collections
import math
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from amprepro.env.apexbuild.errors import ApexError
from amprepro.env.apexbuild.setup_inspect import SetupFacts
from amprepro.env.apexbuild.toolchain import Toolchain

HEARTBEAT_SECONDS = 30.0
EXTENSION_STARTED = re.compile(r"building '([\w.]+)' extension")
NINJA_STEP = re.compile(r"\[(\d+)/(\d+)\] .*?/temp\.[^/ ]+/([\w.]+)/")  # apex builds each extension in its own dir
LINKED = re.compile(r"-o \S*?/([\w.]+?)\.(?:cpython|abi3|so)\S*\.so\b")
KNOWN_FAILURES = [
    (re.compile(r"Unsupported gpu architecture '(compute_\d+)'"),
     "nvcc does not support {0}. Fix: remove it from apex.cuda_arch_list; if setup.py hard-codes it, report it "
     "(the drop-compute_70 patch covers compute_70 only)."),
    (re.compile(r"Killed signal terminated program|cc1plus: out of memory|virtual memory exhausted"),
     "a compiler process ran out of memory. Fix: lower apex.build_jobs (parallel extensions) or export MAX_JOBS=1."),
    (re.compile(r"cuda_runtime\.h: No such file or directory"),
     "the CUDA headers are missing. Fix: install cuda-cudart-dev or point CUDA_HOME at a full toolkit."),
    (re.compile(r"Cuda extensions are being compiled with a version of Cuda that does not match"),
     "apex demands nvcc's release equal torch.version.cuda. Fix: use the matching toolkit."),
    (re.compile(r"No module named '(torch|setuptools|wheel)'"),
     "the build could not import {0}. Fix: install it in this env (the build runs without isolation)."),
    (re.compile(r"option (--[^\n]+?) not recognized"),
     "setup.py did not consume the option {0}. Fix: this ref does not support it; report the flag choice."),
]


@dataclass(frozen=True)
class BuildPlan:
    flags: list[str]
    options: list[str]  # what setup.py receives after bdist_wheel
    env: dict[str, str]  # variables set for the build on top of the caller's environment
    parallel: int | None
    max_jobs: int


def plan_build(setup: SetupFacts, flags: list[str], jobs: int, build_jobs: int | None, tools: Toolchain,
               env: dict, extensions: list[str] | None = None) -> BuildPlan:
    """extensions: what this build compiles (amprepro.apexexts' selection); None: everything the flags add."""
    extensions = list(setup.promised(flags)) if extensions is None else extensions
    parallel = min(build_jobs or jobs, len(extensions)) if setup.parallel_option and len(extensions) > 1 else None
    max_jobs = int(env["MAX_JOBS"]) if env.get("MAX_JOBS") else ninja_slots(
        [setup.source_count(name) for name in extensions], jobs)
    build_env = {"MAX_JOBS": str(max_jobs)}
    if tools.nvcc is not None:  # the chosen toolkit: CUDA_HOME; for pip's also PATH and CPATH (cudakit.build_env)
        build_env.update({"CUDA_HOME": tools.nvcc.cuda_home, **tools.nvcc.env})
    if setup.needs_cuda(flags):
        build_env["TORCH_CUDA_ARCH_LIST"] = tools.arch_list
    build_env.update({setup.env_vars[flag]: "1" for flag in flags if flag in setup.env_vars})
    if parallel and setup.parallel_env:
        build_env["APEX_PARALLEL_BUILD"] = str(parallel)
    options = list(flags) + (["--parallel", str(parallel)] if parallel else [])
    return BuildPlan(flags, options, build_env, parallel, max_jobs)


def ninja_slots(sources: list[int], jobs: int) -> int:
    """MAX_JOBS: ninja's parallelism inside ONE extension (torch's BuildExtension passes it to ninja -j); setup.py's
    --parallel builds the extensions side by side, each with its own ninja. 25.05's amp_C has 15 sources against 1-3
    for the others, so it is the critical path: with MAX_JOBS=2 (12 x 2 on 16 cores) the build took 281 s on the H200,
    amp_C linked last. The most slots that keep the compilers started at once (each extension min(slots, its sources))
    within 2.5x the cores, at least jobs/4 (the earlier rule) and at most the largest extension's sources: the small
    extensions finish in the first seconds and leave their cores to amp_C. Within 2x, on the 7 cores a fresh H200
    gave the build beside the cells (d57d8d6), 14 of amp_C's and fused_layer_norm_cuda's 17 compiles started at once
    and took 65 s; amp_C's last three started only then, and ran 38 s more on fewer than 7 busy cores (125.9 s in all:
    results-reference/perf/d57d8d6-h200). Starting all 17 keeps every core busy to the end. 12 extensions on 16 cores:
    15; amp_C and fused_layer_norm_cuda alone: 15 (every amp_C source at once) on 16, 8 or 7 cores, 13 on 6."""
    best = 1
    for slots in range(1, max(sources, default=1) + 1):
        if sum(min(slots, count) for count in sources) <= 2.5 * jobs:
            best = slots
    return max(best, math.ceil(jobs / 4))


def pip_wheel_command(plan: BuildPlan, source_dir: Path, wheel_dir: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "--no-cache-dir",
            "--disable-pip-version-check", "--wheel-dir", str(wheel_dir),
            *([f"--config-settings=--build-option={' '.join(plan.options)}"] if plan.options else []), str(source_dir)]


def run_build(plan: BuildPlan, source_dir: Path, wheel_dir: Path, log_path: Path, promised: list[str],
              env: dict, echo=print) -> Path:
    """Build the wheel into wheel_dir, logging everything to log_path; the wheel's path, or ApexError."""
    # absolute: pip runs in source_dir, where a relative results dir (the rule's, without apex.cache_dir) is not found
    command = pip_wheel_command(plan, source_dir.resolve(), wheel_dir.resolve())
    start = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(f'{k}={shlex.quote(v)}' for k, v in plan.env.items())} {shlex.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, cwd=source_dir, env={**env, **plan.env}, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
        for line in _lines_with_heartbeat(process, start, tail, promised, echo):
            log.write(f"[{time.monotonic() - start:7.1f}s] {line}")
        code = process.wait()
    if code != 0:
        raise ApexError(f"the apex build failed (exit {code}) after {time.monotonic() - start:.0f} s: "
                        f"{diagnose(log_path.read_text())} Full log: {log_path}\nLast lines:\n{''.join(tail)}")
    wheels = sorted(wheel_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ApexError(f"the build finished but left {len(wheels)} wheels in {wheel_dir}; see {log_path}.")
    return wheels[0]


class Progress:
    """Turns build output into a line per extension started and linked, and a heartbeat every 30 s."""

    def __init__(self, promised: list[str], start: float, echo):
        self.promised, self.start, self.echo = promised, start, echo
        self.started: list[str] = []
        self.linked: list[str] = []
        self.objects: dict[str, tuple[int, int]] = {}  # extension -> (ninja step, steps)
        self.next_beat = start + HEARTBEAT_SECONDS

    def see(self, line: str) -> None:
        if (match := EXTENSION_STARTED.search(line)) and match.group(1) not in self.started:
            self.started.append(match.group(1))
            self.say(f"compiling {match.group(1)} ({len(self.started)}/{len(self.promised)} started)")
        if match := NINJA_STEP.search(line):
            self.objects[match.group(3)] = (int(match.group(1)), int(match.group(2)))
        if (match := LINKED.search(line)) and match.group(1) in self.promised and match.group(1) not in self.linked:
            self.linked.append(match.group(1))
            self.say(f"linked {match.group(1)} ({len(self.linked)}/{len(self.promised)} done)")

    def beat_if_due(self, last_line: str) -> None:
        if time.monotonic() < self.next_beat:
            return
        self.next_beat += HEARTBEAT_SECONDS
        done, total = (sum(step[i] for step in self.objects.values()) for i in (0, 1))
        self.say(f"still building: {len(self.linked)}/{len(self.promised)} extensions linked, ninja steps "
                 f"{done}/{total} of those started; last line: {last_line.strip()[:100]}")

    def say(self, text: str) -> None:
        self.echo(f"[apex] {time.monotonic() - self.start:5.0f} s  {text}", flush=True)


def _lines_with_heartbeat(process, start, tail, promised, echo):
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    progress = Progress(promised, start, echo)
    while True:
        try:
            line = lines.get(timeout=max(0.0, progress.next_beat - time.monotonic()))
        except queue.Empty:
            progress.beat_if_due(tail[-1] if tail else "")
            continue
        if line is None:
            return
        tail.append(line)
        progress.see(line)
        progress.beat_if_due(line)
        yield line


def diagnose(log_text: str) -> str:
    for pattern, explanation in KNOWN_FAILURES:
        if match := pattern.search(log_text):
            return explanation.format(*match.groups())
    return "no known cause recognised; the first error is usually the first 'error' line of the log."


def wheel_extensions(wheel: Path, promised: list[str]) -> list[str]:
    """The promised extension modules that the wheel really contains as compiled libraries."""
    names = zipfile.ZipFile(wheel).namelist()
    return [ext for ext in promised
            if any(name.startswith(ext.replace(".", "/") + ".") and name.endswith(".so") for name in names)]


def require_extensions(built: list[str], promised: list[str], flags: list[str], plan: BuildPlan, log: Path) -> None:
    missing = [ext for ext in promised if ext not in built]
    if not missing:
        return
    if not built:
        raise ApexError(
            f"Python-only build: {' '.join(flags)} asked for {len(promised)} compiled extensions but the wheel has "
            f"none. setup.py never saw the flags (setup.py received: {' '.join(plan.options)}). apex 25.05 "
            "ignores APEX_CPP_EXT/APEX_CUDA_EXT; flags must arrive via --config-settings, and setuptools must be "
            f">= 49.4 (apex issue #1763). Refusing to publish it. Log: {log}")
    raise ApexError(f"the build skipped promised extensions {', '.join(missing)} (built: {', '.join(built)}); "
                    f"see {log}.")
