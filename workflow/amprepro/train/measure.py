"""Honest timing and provenance: CUDA events (or a synchronized clock), warm-up excluded, medians, allocator peaks."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

import torch

from amprepro.train.flops import gpu_uuid


class StepTimer:
    """Times one step. On CUDA with events; on CPU with perf_counter (CPU ops are synchronous).

    sync=False (the training loop's timed steps): the end event is recorded but not waited for, so the host queues the
    next step while the GPU runs this one, as timm's benchmark.py does; `seconds` is then read by `settle()` once the
    stream has run past the event (after the loop). Each step still has its own pair of events, so the median and the
    spread are per step."""

    def __init__(self, device: torch.device, sync: bool = True):
        self.cuda = device.type == "cuda"
        self.sync = sync

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            if self.sync:
                self.settle()
        else:
            self.seconds = time.perf_counter() - self.t0
        return False

    def settle(self) -> float:
        """The step's seconds, waiting for its end event if the GPU has not reached it yet."""
        if self.cuda:
            self.wait()
            self.seconds = self.start.elapsed_time(self.end) / 1000.0
        return self.seconds

    def done(self) -> bool:
        """Whether the GPU has run past the step's end (always on CPU); it does not wait."""
        return self.end.query() if self.cuda else True

    def wait(self) -> None:
        """Until the GPU has run past the step's end (at once on CPU)."""
        if self.cuda:
            self.end.synchronize()


class SideReads:
    """A context to read a finished step's values (its loss, loss scale, skip flag) in, without waiting for the steps
    queued after it. A tensor's value read on the stream that queued it (float(loss)) waits for everything queued
    there since: each progress read emptied the GPU's queue, so the next step started with nothing queued (at 3 warm-up
    steps, the first timed one; issue 40). Once the step's end event has passed (StepTimer.settle), its values are
    final, and an otherwise idle stream copies them at once. On CPU, a plain context."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._context = None

    def __enter__(self):
        self._context = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


class TimedWindow:
    """Where the timed steps' energy and CPU windows start: when the GPU ends the last warm-up step, found without
    emptying the GPU's queue.

    The host runs ahead of the GPU, so when the first timed step is queued the GPU may still be on the warm-up. Waiting
    for it first (torch.cuda.synchronize, until 2026-12-06) left the first timed step to start with nothing queued:
    the mixed-precision 7B cells' first timed steps ran up to 18 % slow, where the host needs nearly as long to queue
    a step as the GPU needs to run it (side by side on one H100, that loop's up to 5.9 %, this one's 0.1 % at most:
    results-reference/perf/first-timed-step/).

    So where the last warm-up step is still running, a thread waits for its end event and reads the counters the
    moment the GPU passes it (before_first), while this thread queues the first timed step; after_first_queued joins
    it. The step itself may wait for the GPU (GradScaler's inf check with a non-fused optimizer, apex's overflow
    check), so the reading cannot wait until the step is queued. Where the GPU is already past the warm-up (the host is
    behind), or there was no warm-up step, the reading is taken at once, after the GPU's queue has run out, as until
    now. read: () -> the start values; NVML and /proc, which another thread may read. The thread needs the GIL to
    read, so the window may open a few ms (Python's switch interval) after the GPU ends the warm-up step; and the end
    event's wait spins, so it keeps a core busy until then."""

    def __init__(self, read):
        self.read, self.start, self._waiter, self._error = read, None, None, None

    def before_first(self, last_warmup: StepTimer | None, device: torch.device) -> None:
        if last_warmup is not None and not last_warmup.done():
            # A new thread's CUDA device is 0: on a DDP rank of another GPU it would open a context there (~0.5 GiB of
            # another rank's memory) inside the wait. It takes this thread's device first.
            index = torch.cuda.current_device() if torch.cuda.is_available() else None

            def wait_and_read():
                try:
                    if index is not None:
                        torch.cuda.set_device(index)
                    last_warmup.wait()
                    self.start = self.read()
                except BaseException as exc:  # raised in after_first_queued, on the loop's thread
                    self._error = exc

            self._waiter = threading.Thread(target=wait_and_read, name="timed-window", daemon=True)
            self._waiter.start()
            return
        if device.type == "cuda":  # what was queued since (a loss's all-reduce, a batch's copy) ends the warm-up's work
            torch.cuda.synchronize(device)
        self.start = self.read()

    def after_first_queued(self) -> None:
        if self._waiter is not None:
            self._waiter.join()
            self._waiter = None
            if self._error is not None:
                raise self._error


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def step_stats(step_seconds: list[float], warmup: int, items_per_step: int) -> dict:
    timed = step_seconds[warmup:]
    median = statistics.median(timed)
    return {
        "timed_steps": len(timed),
        "warmup_steps": warmup,
        "step_time_median_s": median,
        "step_time_p90_s": percentile(timed, 90),
        "step_time_mean_s": statistics.fmean(timed),
        "throughput_per_s": items_per_step / median,
    }


def memory_stats(device: torch.device) -> dict:
    stats = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             "peak_allocated_bytes": None, "peak_reserved_bytes": None}
    if device.type == "cuda":
        stats["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        stats["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return stats


def host_load() -> dict:
    """How busy the host was over the last minute, read right after the timed steps: on a GPU box the apex compile may
    run beside the first cells (workflow/rules/apex.smk), and a reader can see which ones."""
    return {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}


def cpu_snapshot() -> tuple[int, float, float] | None:
    """Now: the host's busy CPU time (/proc/stat's first line: user, nice, system, irq, softirq, steal; clock ticks),
    this process's own CPU seconds (all its threads) and a monotonic clock; None without /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    own = resource.getrusage(resource.RUSAGE_SELF)
    return user + nice + system + irq + softirq + steal, own.ru_utime + own.ru_stime, time.monotonic()


def local_ranks(dist) -> int:
    """How many of this cell's ranks run on this host: LOCAL_WORLD_SIZE under torchrun, else the world (one node)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or getattr(dist, "world", 1) or 1))
    except ValueError:
        return 1


def busy_during(start: tuple | None, end: tuple | None, own_ranks: int = 1) -> dict:
    """CPUs kept busy by other processes between two cpu_snapshot()s (the timed steps): the host's busy CPU time less
    this process's own, over the wall time: 6.0 is six CPUs' worth of other work (a compile, or cells on other GPUs,
    beside the cell), to within a clock tick per CPU. busy_cpus_others leaves out the cell's own other ranks on this
    host, one busy CPU each (own_ranks - 1; under DDP they spin while they wait); busy_cpus_all keeps them. {} where
    either snapshot is missing."""
    if start is None or end is None or end[2] <= start[2]:
        return {}
    wall = end[2] - start[2]
    others = max(0.0, ((end[0] - start[0]) / os.sysconf("SC_CLK_TCK") - (end[1] - start[1])) / wall)
    return {"timed_seconds": round(wall, 3), "busy_cpus_all": round(others, 2),
            "busy_cpus_others": round(max(0.0, others - (own_ranks - 1)), 2)}


def process_age_seconds() -> float | None:
    """Seconds since this process started (a forked cell: since its fork), from /proc; None where there is no /proc."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            fields, up = stat.read().rsplit(")", 1)[1].split(), float(uptime.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, field 22 of proc(5): ticks after boot
        return round(up - started, 2)
    except (OSError, ValueError, IndexError):
        return None


class Phases:
    """Where a cell's seconds went, for its record's phase_seconds (issue 40: a cell job took about 6 s on the H200
    when its timed steps took 1-2): each mark is the wall time since the one before."""

    def __init__(self):
        self.seconds = {"process_start_to_run": process_age_seconds()}
        self.last = time.monotonic()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self.last, 3)
        self.last = now


def thread_pools() -> dict:
    """The threads this process computes with on the host: torch's intra-op pool and each BLAS / OpenMP pool loaded."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        pools = None
    else:
        pools = sorted({f"{pool['user_api']}:{pool['internal_api']}={pool['num_threads']}"
                        for pool in threadpool_info()})
    return {"torch": torch.get_num_threads(), "pools": pools}


def nvidia_smi_query(fields: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def driver_version() -> str | None:
    """The NVIDIA driver's version, as `nvidia-smi --query-gpu=driver_version` prints it: from NVML in this process
    (which the energy meter initialises anyway), else from nvidia-smi, a process of its own that each cell paid for."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        version = version.decode() if isinstance(version, bytes) else str(version)
        if version.strip():
            return version.strip()
    except Exception:  # no pynvml, or NVML not answering: ask nvidia-smi as before
        pass
    return nvidia_smi_query("driver_version")


def hardware(device: torch.device) -> dict:
    info = {"device": device.type, "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "gpu_name": None, "gpu_capability": None, "gpu_count": 0, "driver": None}
    if device.type == "cuda":
        info["gpu_name"] = torch.cuda.get_device_name(device)
        info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        info["driver"] = driver_version()
        info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")  # which GPU(s) of the machine
        info["gpu_uuid"] = gpu_uuid(device)
    return info


def software(apex: dict) -> dict:
    return {
        "python": platform.python_version(),
        "prefix": sys.prefix,  # the interpreter the cell ran in; amprepro.analysis.summary checks environment.json's
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "apex_commit": apex.get("commit"),
        "apex_status": apex.get("status"),
    }


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Breakdown:
    """What the first optimizer step holds, counted tensor by tensor: just before it, the model's weights and gradients
    (under apex O2 also the FP32 master weights and their gradients); just after it, the optimizer state. What the
    allocator peak holds beyond them is activations and workspace (cuBLAS workspace, allocator rounding): counting
    tensors keeps that workspace out of the gradients, where allocator readings put it (64 MiB of a tiny model's
    0.5 MB gradients on the H200)."""

    KEYS = ("weights", "gradients", "optimizer_state", "master_weights", "activations_and_workspace")

    def __init__(self, model, optimizer, enabled: bool = True):
        """enabled=False (the CPU, which has no allocator peak to split) reports None."""
        self.model, self.optimizer, self.sizes = model, optimizer, {}
        if enabled:
            self.hooks = [optimizer.register_step_pre_hook(self._before),
                          optimizer.register_step_post_hook(self._after)]

    def masters(self) -> list:
        """apex O2's FP32 master copies (the optimizer's stash); empty for every other precision."""
        return list(getattr(getattr(self.optimizer, "_amp_stash", None), "all_fp32_from_fp16_params", None) or [])

    def _before(self, *_):
        if "weights" in self.sizes:
            return
        params, masters = list(self.model.parameters()), self.masters()
        self.sizes.update(weights=tensor_bytes(params),
                          gradients=tensor_bytes(p.grad for p in params) + tensor_bytes(m.grad for m in masters),
                          master_weights=tensor_bytes(masters) if masters else None)

    def _after(self, *_):
        if "optimizer_state" not in self.sizes:
            self.sizes["optimizer_state"] = tensor_bytes(
                t for state in self.optimizer.state.values() for t in state.values() if hasattr(t, "element_size"))
            for hook in self.hooks:
                hook.remove()

    def result(self, peak_allocated: int | None) -> dict:
        if "optimizer_state" not in self.sizes or peak_allocated is None:
            return dict.fromkeys(self.KEYS)
        held = sum(self.sizes[k] or 0 for k in ("weights", "gradients", "optimizer_state", "master_weights"))
        return {**{k: self.sizes[k] for k in self.KEYS[:4]}, "activations_and_workspace": peak_allocated - held}
