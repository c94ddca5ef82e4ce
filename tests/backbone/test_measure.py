import pytest
import torch

from amprepro import measure


def test_percentile_interpolates():
    assert measure.percentile([1, 2, 3, 4, 5], 50) == 3
    assert measure.percentile([0, 10], 90) == pytest.approx(9.0)
    assert measure.percentile([7], 90) == 7


def test_step_stats_exclude_warmup():
    seconds = [10.0, 10.0] + [0.1] * 9 + [0.2]
    stats = measure.step_stats(seconds, warmup=2, items_per_step=32)
    assert stats["timed_steps"] == 10
    assert stats["step_time_median_s"] == pytest.approx(0.1)
    assert stats["throughput_per_s"] == pytest.approx(320.0)
    assert stats["step_time_p90_s"] == pytest.approx(0.11)


def test_cpu_timer_measures_wall_time():
    with measure.StepTimer(torch.device("cpu")) as timer:
        sum(range(100000))
    assert 0 < timer.seconds < 5


def test_memory_on_cpu_has_rss_but_no_allocator_peak():
    stats = measure.memory_stats(torch.device("cpu"))
    assert stats["peak_rss_bytes"] > 10 * 2**20
    assert stats["peak_allocated_bytes"] is None


class RecordingNvml:
    """Records which NVML lookup was asked for (NVML itself needs a GPU)."""

    def __init__(self):
        self.calls = []

    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802 (NVML's names)
        self.calls.append(("uuid", uuid))
        return "by-uuid"

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        self.calls.append(("index", index))
        return "by-index"


def test_energy_is_read_from_the_gpu_this_process_runs_on():
    """NVML ignores CUDA_VISIBLE_DEVICES: on the H200 pair, a cell on GPU 1 read GPU 0's energy by index."""
    from amprepro.flops import nvml_handle

    nvml = RecordingNvml()
    assert nvml_handle(nvml, "GPU-e05d", 0, "1") == "by-uuid" and nvml.calls == [("uuid", "GPU-e05d")]
    assert nvml_handle(RecordingNvml(), None, 0, None) == "by-index"
    assert nvml_handle(RecordingNvml(), None, 0, "1") is None  # cannot tell which GPU: no energy, not a wrong one
