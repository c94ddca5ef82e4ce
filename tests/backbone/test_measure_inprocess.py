"""amprepro.train.measure's figures checked against hand computations: percentiles and step statistics, the peak
record, the tensor-by-tensor split of the first optimizer step, and the provenance records (hardware, software, host
load, thread pools, nvidia-smi). The CUDA branches run on this CPU machine with torch.cuda's query functions standing
in for a GPU's answers (tests/gpu checks them on a real card). Fast: a Linear layer, no training run."""

from __future__ import annotations

import os
import platform
import sys
import threading
import types

import pytest
import torch

from amprepro.train import measure


@pytest.mark.parametrize("values, q, expected", [
    ([5, 1, 4, 2, 3], 50, 3),               # sorted first
    ([0, 10], 90, 9.0),                     # rank 0.9: 0 + 10 * 0.9
    ([0, 10, 20, 30], 50, 15.0),            # rank 1.5: 10 + 10 * 0.5
    ([0, 10, 20, 30], 90, 27.0),            # rank 2.7: 20 + 10 * 0.7
    ([0, 10, 20, 30], 100, 30),             # rank 3: the last, no element beyond it
    ([0, 10, 20, 30], 0, 0),
    ([3.0, 1.0], 25, 1.5),                  # rank 0.25 of [1, 3]
    ([7], 90, 7),
    ([7], 0, 7),
])
def test_percentile_is_linear_between_the_sorted_values(values, q, expected):
    assert measure.percentile(values, q) == pytest.approx(expected, abs=1e-12)


def test_step_stats_time_only_the_steps_after_the_warmup():
    seconds = [9.0, 9.0, 9.0, 0.4, 0.1, 0.3, 0.2]  # timed: 0.4 0.1 0.3 0.2
    stats = measure.step_stats(seconds, warmup=3, items_per_step=10)
    assert stats["timed_steps"] == 4 and stats["warmup_steps"] == 3
    assert stats["step_time_median_s"] == pytest.approx(0.25)      # (0.2 + 0.3) / 2
    assert stats["step_time_p90_s"] == pytest.approx(0.37)         # rank 2.7 of [0.1 0.2 0.3 0.4]: 0.3 + 0.07
    assert stats["step_time_mean_s"] == pytest.approx(0.25)        # 1.0 / 4
    assert stats["throughput_per_s"] == pytest.approx(10 / 0.25)   # items per median step
    assert set(stats) == {"timed_steps", "warmup_steps", "step_time_median_s", "step_time_p90_s",
                          "step_time_mean_s", "throughput_per_s"}
    odd = measure.step_stats([1.0, 0.5, 0.1, 0.3], warmup=1, items_per_step=3)
    assert odd["step_time_median_s"] == pytest.approx(0.3) and odd["step_time_mean_s"] == pytest.approx(0.3)
    assert odd["throughput_per_s"] == pytest.approx(10.0)


def test_the_cuda_peak_is_the_allocators_and_the_cpu_peak_the_processes(monkeypatch):
    import resource

    cpu = measure.memory_stats(torch.device("cpu"))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss is in KiB on Linux
    assert 0 < cpu["peak_rss_bytes"] <= after and cpu["peak_rss_bytes"] % 1024 == 0
    assert cpu["peak_rss_bytes"] > after / 2  # KiB made bytes, not left as KiB
    assert cpu["peak_allocated_bytes"] is None and cpu["peak_reserved_bytes"] is None
    asked = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: asked.append(device) or 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: asked.append(device) or 4 * 2**30)
    gpu = measure.memory_stats(torch.device("cuda", 1))
    assert gpu["peak_allocated_bytes"] == 3 * 2**30 and gpu["peak_reserved_bytes"] == 4 * 2**30
    assert asked == [torch.device("cuda", 1)] * 2 and gpu["peak_rss_bytes"] > 0


def test_host_load_and_thread_pools_describe_this_process():
    before = os.getloadavg()[0]
    load = measure.host_load()
    after = os.getloadavg()[0]
    assert load["cpus"] == os.cpu_count()
    assert min(before, after) - 0.006 <= load["load_1min"] <= max(before, after) + 0.006
    assert round(load["load_1min"], 2) == load["load_1min"]
    pools = measure.thread_pools()
    assert pools["torch"] == torch.get_num_threads()
    pytest.importorskip("threadpoolctl")
    assert pools["pools"] and all(":" in p and "=" in p for p in pools["pools"]) and pools["pools"] == sorted(
        pools["pools"])


def test_thread_pools_without_threadpoolctl_say_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails with ImportError
    assert measure.thread_pools() == {"torch": torch.get_num_threads(), "pools": None}


def fake_smi(tmp_path, monkeypatch, script):
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_nvidia_smi_query_reads_the_first_gpus_line(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, 'echo "$1 $2"\necho second\n')
    assert measure.nvidia_smi_query("driver_version") == "--query-gpu=driver_version --format=csv,noheader"
    fake_smi(tmp_path, monkeypatch, "echo 580.65 >&2\nexit 3\n")
    assert measure.nvidia_smi_query("driver_version") is None  # a failed query is no answer
    fake_smi(tmp_path, monkeypatch, "echo '  '\n")
    assert measure.nvidia_smi_query("driver_version") is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert measure.nvidia_smi_query("driver_version") is None


def test_a_hung_nvidia_smi_is_given_at_most_20_seconds(monkeypatch, tmp_path):
    fake_smi(tmp_path, monkeypatch, "echo unused\n")
    asked = {}

    def hangs(command, **options):
        asked.update(options)
        raise measure.subprocess.TimeoutExpired(command, options.get("timeout"))

    monkeypatch.setattr(measure.subprocess, "run", hangs)
    assert measure.nvidia_smi_query("driver_version") is None
    assert asked["timeout"] is not None and 0 < asked["timeout"] <= 20  # a wedged driver does not stall a cell


def test_the_timer_lets_an_exception_of_the_step_through():
    with pytest.raises(RuntimeError, match="out of memory"), measure.StepTimer(torch.device("cpu")):
        raise RuntimeError("out of memory")


def test_the_cudnn_version_is_recorded_only_where_cudnn_is_available(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    assert measure.software({})["cudnn"] == 91002
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    assert measure.software({})["cudnn"] is None


def test_hardware_on_the_cpu_has_no_gpu():
    info = measure.hardware(torch.device("cpu"))
    assert info == {"device": "cpu", "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "gpu_name": None, "gpu_capability": None, "gpu_count": 0, "driver": None}
    assert info["cpu"]


def test_hardware_on_a_gpu_names_the_card_and_which_one(tmp_path, monkeypatch):
    # the driver only for the query that asks for it
    fake_smi(tmp_path, monkeypatch, '[ "$1" = --query-gpu=driver_version ] && [ "$2" = --format=csv,noheader ] '
                                    "&& echo 580.65.06 || exit 1\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    this = torch.device("cuda", 1)  # every query must be about this device, not the current one
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: {this: "NVIDIA H200"}[device])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: {this: (9, 0)}[device])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: {this: types.SimpleNamespace(uuid="e05d-11",
                                                                    total_memory=150_121_480_192)}[device])
    info = measure.hardware(this)
    assert info["device"] == "cuda" and info["gpu_name"] == "NVIDIA H200"
    assert info["gpu_capability"] == "9.0" and info["gpu_count"] == 2 and info["driver"] == "580.65.06"
    assert info["cuda_visible_devices"] == "3" and info["gpu_uuid"] == "GPU-e05d-11"
    assert info["cpu_count"] == os.cpu_count()
    assert info["gpu_memory_bytes"] == 150_121_480_192  # the card's own memory (the LoRA claim answers for it)


def test_software_names_this_interpreter_and_the_apex_record():
    record = measure.software({"commit": "abc", "status": "built"})
    assert record["python"] == platform.python_version() and record["prefix"] == sys.prefix
    assert record["torch"] == torch.__version__ and record["cuda"] == torch.version.cuda
    assert record["apex_commit"] == "abc" and record["apex_status"] == "built"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    assert record["cudnn"] == cudnn
    assert measure.software({})["apex_status"] is None


def test_tensor_bytes_counts_elements_times_their_size():
    tensors = [torch.zeros(3, 4), None, torch.zeros(5, dtype=torch.float16), torch.zeros(2, dtype=torch.int64)]
    assert measure.tensor_bytes(tensors) == 3 * 4 * 4 + 5 * 2 + 2 * 8
    assert measure.tensor_bytes([]) == 0


def test_the_breakdown_counts_the_first_step_once_and_the_rest_is_activations():
    model = torch.nn.Linear(4, 3)                       # 12 + 3 float32 parameters: 60 bytes
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # a momentum buffer per parameter
    breakdown = measure.Breakdown(model, optimizer)
    assert breakdown.masters() == []
    assert breakdown.result(1000) == dict.fromkeys(measure.Breakdown.KEYS)  # no step yet
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    assert len(optimizer._optimizer_step_pre_hooks) == 0 and len(optimizer._optimizer_step_post_hooks) == 0
    model.bias.grad = None                              # a later step is not counted again
    with torch.no_grad():
        model.weight.grad = torch.zeros(3, 4)
    optimizer.state[model.weight]["extra"] = torch.zeros(100)
    optimizer.step()
    result = breakdown.result(1000)
    assert result == {"weights": 60, "gradients": 60, "optimizer_state": 60, "master_weights": None,
                      "activations_and_workspace": 1000 - 60 - 60 - 60}
    assert breakdown.result(None) == dict.fromkeys(measure.Breakdown.KEYS)
    assert list(result) == list(measure.Breakdown.KEYS)


def test_the_breakdown_counts_only_tensors_of_the_optimizer_state():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    breakdown = measure.Breakdown(model, optimizer)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    # exp_avg and exp_avg_sq are parameter-sized; the step counter is one float32 per parameter tensor
    assert breakdown.result(500)["optimizer_state"] == 2 * 60 + 2 * 4
    assert breakdown.result(500)["activations_and_workspace"] == 500 - 60 - 60 - 128


def test_the_breakdown_of_apex_o2_adds_the_fp32_masters_and_their_gradients():
    model = torch.nn.Linear(10, 10, bias=False).half()   # 200 bytes of fp16 weights
    model.weight.grad = torch.zeros_like(model.weight)
    master = torch.zeros(10, 10, requires_grad=True)     # 400 bytes of fp32 master weights
    master.grad = torch.zeros(10, 10)
    optimizer = torch.optim.SGD([master], lr=0.1)        # no momentum: no state
    optimizer._amp_stash = types.SimpleNamespace(all_fp32_from_fp16_params=[master])
    breakdown = measure.Breakdown(model, optimizer)
    assert breakdown.masters() == [master]
    optimizer.step()
    assert breakdown.result(2000) == {"weights": 200, "gradients": 200 + 400, "optimizer_state": 0,
                                      "master_weights": 400, "activations_and_workspace": 2000 - 200 - 600 - 400}


def test_a_disabled_breakdown_hooks_nothing():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    breakdown = measure.Breakdown(model, optimizer, enabled=False)
    assert len(optimizer._optimizer_step_pre_hooks) == 0
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert breakdown.result(1000) == dict.fromkeys(measure.Breakdown.KEYS)


class FakeNVML(types.ModuleType):
    """pynvml as far as driver_version uses it, counting init and shutdown."""

    def __init__(self, version=None, fails=False):
        super().__init__("pynvml")
        self.version, self.fails, self.calls = version, fails, []

    def nvmlInit(self):
        self.calls.append("init")
        if self.fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlSystemGetDriverVersion(self):
        self.calls.append("version")
        return self.version

    def nvmlShutdown(self):
        self.calls.append("shutdown")


@pytest.mark.parametrize("version", ["580.159.04", b"580.159.04"])
def test_the_driver_version_comes_from_nvml_without_starting_nvidia_smi(tmp_path, monkeypatch, version):
    fake_smi(tmp_path, monkeypatch, f"touch {tmp_path}/smi-ran; echo 1.0\n")
    nvml = FakeNVML(version)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert measure.driver_version() == "580.159.04"
    assert nvml.calls == ["init", "version", "shutdown"] and not (tmp_path / "smi-ran").exists()


@pytest.mark.parametrize("nvml", [FakeNVML(fails=True), FakeNVML(" "), None])
def test_without_an_answer_from_nvml_nvidia_smi_is_asked(tmp_path, monkeypatch, nvml):
    fake_smi(tmp_path, monkeypatch, "echo 580.65.06\n")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: import fails
    assert measure.driver_version() == "580.65.06"
    if nvml is not None and not nvml.fails:
        assert nvml.calls == ["init", "version", "shutdown"]  # NVML's reference count let go again


def test_the_cpus_other_processes_keep_busy_are_counted_and_this_processs_own_are_not():
    """measure.busy_during on two snapshots around a second of a busy child process: about one CPU of other work; the
    same second spent busy in this process does not count (the CI machine's other work may only add)."""
    import subprocess
    import sys

    start = measure.cpu_snapshot()
    if start is None:
        pytest.skip("no /proc/stat here")
    spin = "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    child.wait(timeout=60)
    busy = measure.busy_during(start, measure.cpu_snapshot())
    assert busy["timed_seconds"] >= 1.0 and busy["busy_cpus_others"] >= 0.6
    hz = os.sysconf("SC_CLK_TCK")
    own = measure.busy_during((0, 0.0, 10.0), (4 * hz, 1.0, 12.0))  # 4 CPU-seconds of which 1 was this process's
    assert own == {"timed_seconds": 2.0, "busy_cpus_all": 1.5, "busy_cpus_others": 1.5}
    # a 2-rank DDP cell: the other rank's busy CPU is the cell's own, not something beside it
    assert measure.busy_during((0, 0.0, 10.0), (4 * hz, 1.0, 12.0), own_ranks=2)["busy_cpus_others"] == 0.5
    assert measure.busy_during((0, 0.0, 10.0), (2 * hz, 1.0, 12.0), own_ranks=4)["busy_cpus_others"] == 0.0
    assert measure.busy_during((0, 3.0, 10.0), (hz, 4.5, 11.0))["busy_cpus_others"] == 0.0  # never below zero
    assert measure.busy_during(None, start) == {} and measure.busy_during(start, start) == {}


def test_a_cells_own_ranks_on_this_host(monkeypatch):
    class Dist:
        world = 4

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert measure.local_ranks(Dist()) == 4 and measure.local_ranks(object()) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun over two nodes: two of the four here
    assert measure.local_ranks(Dist()) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    assert measure.local_ranks(Dist()) == 1


class QueuedStep:
    """A warm-up step's timer as the GPU sees it: running until finish(), then done; wait() blocks until then."""

    def __init__(self, running):
        self.ended = threading.Event()
        if not running:
            self.ended.set()

    def done(self):
        return self.ended.is_set()

    def finish(self):
        self.ended.set()

    def wait(self):
        assert self.ended.wait(10), "the warm-up step never ended"


def window_log(monkeypatch, read=None):
    log, was_read = [], threading.Event()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("empty the queue"))

    def reading():
        log.append("read")
        was_read.set()
        if read:
            read()
        return ("joules", "cpu")

    return log, was_read, measure.TimedWindow(reading)


def test_the_window_opens_when_the_gpu_ends_the_warmup_while_the_first_timed_step_is_being_queued(monkeypatch):
    """The first timed step is queued while the GPU still runs the last warm-up step; the counters are read when the
    GPU ends that step, even while the host waits inside the first timed step for the GPU (GradScaler's inf check
    with a non-fused optimizer), not once the step is queued: that would leave part of the step out of the window."""
    log, was_read, window = window_log(monkeypatch)
    devices = []  # a DDP rank on GPU 3: the waiting thread takes GPU 3, not a new thread's GPU 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: devices.append((index, threading.current_thread())))
    warmup = QueuedStep(running=True)
    window.before_first(warmup, torch.device("cuda", 3))
    log.append("queue the first timed step")
    assert log == ["queue the first timed step"] and window.start is None  # nothing emptied, nothing read yet
    warmup.finish()  # the GPU passes the warm-up's end event; the host is inside the step, waiting for the GPU
    assert was_read.wait(10), "the counters were not read when the warm-up step ended"
    log.append("the first timed step returns")
    window.after_first_queued()
    assert log == ["queue the first timed step", "read", "the first timed step returns"]
    assert window.start == ("joules", "cpu")
    assert [index for index, _ in devices] == [3] and devices[0][1] is not threading.current_thread()
    window.after_first_queued()  # once only
    assert log.count("read") == 1


def test_a_failed_reading_is_raised_on_the_loops_thread(monkeypatch):
    def broken():
        raise RuntimeError("NVML went away")

    _, _, window = window_log(monkeypatch, read=broken)
    warmup = QueuedStep(running=True)
    window.before_first(warmup, torch.device("cuda"))
    warmup.finish()
    with pytest.raises(RuntimeError, match="NVML went away"):
        window.after_first_queued()


@pytest.mark.parametrize("last_warmup, device, expected", [
    ("done", "cuda", ["empty the queue", "read"]),    # the host is behind: the GPU has run past the warm-up already
    (None, "cuda", ["empty the queue", "read"]),      # no warm-up step: the building's queued work ends first
    ("done", "cpu", ["read"]),                        # CPU ops are synchronous
])
def test_the_window_starts_before_the_first_timed_step_where_nothing_of_the_warmup_is_left(monkeypatch, last_warmup,
                                                                                            device, expected):
    log, _, window = window_log(monkeypatch)
    timer = QueuedStep(running=False) if last_warmup == "done" else None
    window.before_first(timer, torch.device(device))
    assert log == expected and window.start == ("joules", "cpu")
    window.after_first_queued()
    assert log == expected  # no second reading


def test_side_reads_are_a_plain_context_on_the_cpu():
    reads = measure.SideReads(torch.device("cpu"))
    assert reads.stream is None
    with reads:
        assert float(torch.tensor(2.5)) == 2.5


def test_a_cpu_timer_is_always_done_and_a_cuda_timer_asks_its_end_event(monkeypatch):
    with measure.StepTimer(torch.device("cpu")) as timer:
        pass
    assert timer.done() is True
    asked = []

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def query(self):
            asked.append("query")
            return False

    monkeypatch.setattr(torch.cuda, "Event", Event)
    with measure.StepTimer(torch.device("cuda"), sync=False) as timer:
        pass
    assert timer.done() is False and asked == ["query"]
