"""The GPU measurement path against independent clocks and known quantities (skipped, with the reason, without CUDA):

- StepTimer's CUDA-event step time against a synchronised wall clock over the same steps;
- the allocator peak that memory_stats reports against an allocation of a known size;
- the matmul peak that the `peak` stage measures (MFU's denominator) against the card's datasheet.

Run on a GPU box: `OUT=<dir> bash tools/gpu/measurement.sh` (or `python -m pytest -rs tests/gpu/test_measurement.py`).
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from amprepro import precisions
from amprepro.env import peak
from amprepro.train import flops, measure

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")]
MIB = 2**20


@pytest.fixture
def device():
    torch.cuda.synchronize()
    return torch.device("cuda")


def gpu_work(a, b, repeats: int):
    for _ in range(repeats):
        a = a @ b
    return a


# CUDA events time the GPU's work between the two records; the synchronised wall clock adds the host's launch and
# synchronisation overhead (tens of microseconds on a step of several milliseconds). Tolerance: the event time is at
# most the wall time (plus 0.1 ms of clock granularity) and at least 90 % of it less 0.5 ms.
def test_cuda_event_step_time_matches_a_synchronised_wall_clock(device):
    a = torch.randn(4096, 4096, device=device)
    b = torch.randn(4096, 4096, device=device) / 64
    gpu_work(a, b, 3)  # warm-up: cuBLAS handles, kernels chosen
    events, walls = [], []
    for repeats in (2, 4, 8, 16, 4, 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with measure.StepTimer(device) as timer:
            gpu_work(a, b, repeats)
        walls.append(time.perf_counter() - start)  # StepTimer's exit synchronised on its end event
        events.append(timer.seconds)
    pairs = list(zip(events, walls))
    assert all(event <= wall + 1e-4 for event, wall in pairs), pairs
    assert all(event >= 0.9 * wall - 5e-4 for event, wall in pairs), pairs
    assert min(events) > 1e-3 and max(events) < 5.0, f"seconds, not milliseconds: {events}"
    # twice the matmuls, about twice the time: the timer follows the work, not a constant overhead
    assert events[3] / events[2] == pytest.approx(2.0, rel=0.2), events


def test_step_stats_from_cuda_event_times_give_the_throughput_of_the_wall_clock(device):
    a = torch.randn(2048, 2048, device=device)
    b = torch.randn(2048, 2048, device=device) / 45
    seconds = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(25):
        with measure.StepTimer(device) as timer:
            gpu_work(a, b, 8)
        seconds.append(timer.seconds)
    wall_per_step = (time.perf_counter() - start) / 25
    stats = measure.step_stats(seconds, warmup=5, items_per_step=64)
    assert stats["step_time_median_s"] == pytest.approx(statistics.median(seconds[5:]))
    assert stats["step_time_median_s"] <= wall_per_step * 1.05 + 1e-4
    assert stats["throughput_per_s"] >= 64 / (wall_per_step * 1.05 + 1e-4)


@pytest.mark.parametrize("size_mib", [64, 512])
def test_the_allocator_peak_is_the_known_allocation(device, size_mib):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    block = torch.empty(size_mib * MIB, dtype=torch.uint8, device=device)
    stats = measure.memory_stats(device)
    grown = stats["peak_allocated_bytes"] - before
    # the caching allocator rounds a large block up to a multiple of 2 MiB: a size in whole MiB comes back as is
    assert grown == size_mib * MIB, (grown, size_mib * MIB)
    assert stats["peak_reserved_bytes"] >= stats["peak_allocated_bytes"]
    del block
    assert measure.memory_stats(device)["peak_allocated_bytes"] == stats["peak_allocated_bytes"]  # a peak stays


# The measured matmul ceiling must lie in a plausible band of the card's dense datasheet figure: below it (a
# measurement above the datasheet means a timing bug: milliseconds as seconds, or a missed synchronisation) and above
# 50 % of it (on the H200, 2026-11-29: FP32 51, TF32 411-414, BF16 794-796, FP16 762-765 TFLOP/s, 76-84 %).
BAND = (0.5, 1.02)


def test_the_measured_matmul_peak_is_in_a_plausible_band_for_the_card(device):
    name = torch.cuda.get_device_name(device)
    product = flops.datasheet_product(name)
    if product is None:
        pytest.skip(f"no datasheet figures for {name!r} (amprepro.train.flops.PRODUCT_NAMES): no band to check")
    record = peak.measure()  # what the pipeline's peak rule measures: the four matmul dtypes, FP8 where it can
    measured = record["tflops"]
    datasheet = flops.DATASHEET_TFLOPS[product]
    print(f"{name} ({product}): measured {measured} TFLOP/s; datasheet {datasheet}")
    kinds = {p.peak_kind for p in precisions.REGISTRY.values()}
    if flops.fp8_peak_skip_reason(device) is not None:
        kinds.discard("fp8")
        assert record["fp8"]["status"] == "skipped"
    assert set(measured) == kinds, "a precision without its peak"
    for kind, value in measured.items():
        if datasheet[kind] is None:
            continue
        ratio = value / datasheet[kind]
        assert BAND[0] <= ratio <= BAND[1], f"{kind}: {value:.1f} TFLOP/s is {ratio:.0%} of the datasheet's " \
                                            f"{datasheet[kind]} ({product})"
    assert torch.backends.cuda.matmul.allow_tf32 is False, "the peak measurement left TF32 on"


def spin(seconds: float) -> None:
    """Queue about `seconds` of GPU work: torch.cuda._sleep spins for a number of cycles (at the SM clock, ~1-2 GHz)."""
    torch.cuda._sleep(int(seconds * 1.5e9))


# The train loop reads a step's loss and loss scale after the step's end event, on a side stream (measure.SideReads):
# a read on the loop's own stream waits for every step queued after it, which emptied the GPU's queue (issue 40).
def test_a_side_read_does_not_wait_for_the_work_queued_after_the_value(device):
    value = torch.full((), 3.0, device=device)
    with measure.SideReads(device):  # a first read allocates pinned host memory, which synchronises: before the timing
        float(value)
    torch.cuda.synchronize()
    spin(0.5)  # a later step, still queued
    reads = measure.SideReads(device)
    started = time.perf_counter()
    with reads:
        got = float(value)
    side_s = time.perf_counter() - started
    started = time.perf_counter()
    assert float(value) == 3.0  # on the loop's stream: behind the spin
    main_s = time.perf_counter() - started
    assert got == 3.0
    assert side_s < 0.05 and main_s > 0.1, (side_s, main_s)


# measure.TimedWindow: where the last warm-up step is still running, the counters are read the moment the GPU ends it,
# from a thread, while the loop queues the first timed step and even waits inside it for the GPU.
def test_the_timed_window_opens_when_the_gpu_ends_the_warmup_step_not_when_the_host_is_done(device):
    with measure.StepTimer(device, sync=False) as warmup:
        spin(0.3)
    started, read_at = time.perf_counter(), []
    window = measure.TimedWindow(lambda: read_at.append(time.perf_counter()) or ("joules", "cpu"))
    window.before_first(warmup, device)
    with measure.StepTimer(device, sync=False) as first:
        spin(0.3)
        torch.cuda.synchronize()  # a host wait inside the step (GradScaler's inf check with a non-fused optimizer)
    host_done = time.perf_counter()
    window.after_first_queued()
    warmup_s, first_s = warmup.settle(), first.settle()
    assert window.start == ("joules", "cpu") and len(read_at) == 1
    opened = read_at[0] - started
    assert opened < warmup_s + 0.05, (opened, warmup_s)  # at the warm-up's end (its time left, at most)
    assert host_done - started > warmup_s + first_s * 0.8, (host_done - started, warmup_s, first_s)
