import typing

import pytest
import torch

from amprepro.train import measure


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


def test_cpu_timer_measures_wall_time_in_seconds():
    import time

    with measure.StepTimer(torch.device("cpu")) as timer:
        time.sleep(0.05)
    assert 0.045 <= timer.seconds < 1.0, timer.seconds  # seconds: 50 ms is 0.05, not 50 (or 5e-5)


class FakeCudaEvent:
    """Stands in for torch.cuda.Event on a machine without CUDA: CUDA events report elapsed time in milliseconds
    (tests/gpu/test_measurement.py checks the real ones against a synchronised wall clock)."""

    log: typing.ClassVar[list] = []

    def __init__(self, enable_timing=False):
        assert enable_timing, "a timing event needs enable_timing=True"
        self.recorded = False

    def record(self):
        self.recorded = True
        self.log.append("record")

    def synchronize(self):
        assert self.recorded
        self.log.append("synchronize")

    def elapsed_time(self, end):
        assert self.recorded and end.recorded and self.log[-1] == "synchronize", "read before the end event ran"
        return 250.0  # ms


def test_cuda_timer_converts_the_events_milliseconds_to_seconds(monkeypatch):
    FakeCudaEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    with measure.StepTimer(torch.device("cuda")) as timer:
        assert FakeCudaEvent.log == ["record"]
    assert FakeCudaEvent.log == ["record", "record", "synchronize"]
    assert timer.seconds == 0.25


def test_memory_on_cpu_has_rss_but_no_allocator_peak():
    stats = measure.memory_stats(torch.device("cpu"))
    assert stats["peak_rss_bytes"] > 10 * 2**20
    assert stats["peak_allocated_bytes"] is None


class RecordingNvml:
    """Records which NVML lookup was asked for (NVML itself needs a GPU)."""

    def __init__(self):
        self.calls = []

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("uuid", uuid))
        return "by-uuid"

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(("index", index))
        return "by-index"


def test_energy_is_read_from_the_gpu_this_process_runs_on():
    """NVML ignores CUDA_VISIBLE_DEVICES: on the H200 pair, a cell on GPU 1 read GPU 0's energy by index."""
    from amprepro.train.flops import nvml_handle

    nvml = RecordingNvml()
    assert nvml_handle(nvml, "GPU-e05d", 0, "1") == "by-uuid" and nvml.calls == [("uuid", "GPU-e05d")]
    assert nvml_handle(RecordingNvml(), None, 0, None) == "by-index"
    assert nvml_handle(RecordingNvml(), None, 0, "1") is None  # cannot tell which GPU: no energy, not a wrong one


@pytest.mark.parametrize("name, product, bf16", [
    ("NVIDIA H200", "H200 SXM", 989.5),  # the name of the reference's GPU (reference/nvidia-h200)
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe", 312.0),
    ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA L4", "L4", 121.0),
])
def test_datasheet_peaks_are_keyed_by_the_exact_product(name, product, bf16):
    from amprepro.train import flops

    assert flops.datasheet_product(name) == product
    assert flops.datasheet_peak(name, "amp_bf16") == bf16
    assert product in flops.datasheet_note(name)


@pytest.mark.parametrize("name", ["NVIDIA H200 SXM 141GB Engineering Sample", "NVIDIA GeForce RTX 4090",
                                  "NVIDIA L40", "NVIDIA A100X", "Tesla V100S-PCIE-32GB", None])
def test_an_unknown_product_gets_no_datasheet_peak_and_says_why(name):
    from amprepro.train import flops

    assert flops.datasheet_peak(name, "amp_bf16") is None
    assert "no datasheet peak" in flops.datasheet_note(name)
