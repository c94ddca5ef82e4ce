"""amprepro.train.precision on the CPU: what each precision passes to torch (autocast dtype, GradScaler and its first
scale, TF32 flags) and to apex (opt level, verbosity, the cast cache, the fused kernels, scale_loss), each reason a
machine cannot run a precision, and what a step reports (loss, scale, skipped). CUDA's queries and apex are fakes
(docs/mutation.md: these tests are what kills the module's mutants)."""

from __future__ import annotations

import contextlib
import sys
import types
import warnings

import pytest
import torch

from amprepro.train import precision as prec

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def card(monkeypatch):
    """torch.cuda's answers for a GPU of the capability the test sets."""
    state = types.SimpleNamespace(capability=(8, 0), bf16=True, asked=[])

    def capability(device=None):
        state.asked.append(device)
        return state.capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: state.bf16)
    return state


BUILT = {"status": "built", "has_amp": True, "commit": "abc"}


@pytest.mark.parametrize(("precision", "reason"), [
    ("fp32", None), ("amp_bf16", None), ("amp_bf16_compile", None),
    ("tf32", "TF32 is a Tensor Core mode of NVIDIA GPUs (compute capability >= 8.0); no CUDA GPU here"),
    ("amp_fp16", "fp16 AMP with GradScaler is the CUDA recipe the articles measure; no CUDA GPU here"),
    ("amp_fp16_unscaled", "fp16 autocast with no loss scaler is timm benchmark.py's CUDA recipe; no CUDA GPU here"),
    ("apex_o1", "apex.amp runs on CUDA GPUs only; no CUDA GPU here"),
    ("apex_o2", "apex.amp runs on CUDA GPUs only; no CUDA GPU here"),
    ("fp8_rowwise", "fp8_rowwise: FP8 matmuls (torch._scaled_mm) need an NVIDIA GPU of compute capability >= 8.9 "
                    "(Ada, Hopper or newer); no CUDA GPU here"),
])
def test_what_the_cpu_cannot_run_and_why(precision, reason):
    assert prec.unsupported_reason(precision, CPU, BUILT) == reason


def test_tf32_needs_compute_capability_8(card):
    card.capability = (7, 5)
    assert prec.unsupported_reason("tf32", GPU, {}) == (
        "TF32 needs compute capability >= 8.0; this GPU is (7, 5)")
    assert card.asked and all(device == GPU for device in card.asked)
    card.capability = (8, 0)
    assert prec.unsupported_reason("tf32", GPU, {}) is None
    assert prec.unsupported_reason("fp32", GPU, {}) is None
    assert prec.unsupported_reason("amp_fp16", GPU, {}) is None


def test_bf16_needs_a_gpu_that_supports_it(card):
    card.bf16 = False
    assert prec.unsupported_reason("amp_bf16", GPU, {}) == (
        "this GPU does not support bf16 (needs compute capability >= 8.0)")
    assert prec.unsupported_reason("amp_bf16", CPU, {}) is None  # CPU autocast runs bf16
    assert prec.unsupported_reason("amp_fp16", GPU, {}) is None
    card.bf16 = True
    assert prec.unsupported_reason("amp_bf16", GPU, {}) is None


def test_fp8_is_judged_by_its_capability_before_bf16(card):
    card.capability, card.bf16 = (8, 0), False
    assert prec.unsupported_reason("fp8_tensorwise", GPU, {}) == (
        "fp8_tensorwise: FP8 matmuls (torch._scaled_mm) need compute capability >= 8.9 (Ada, Hopper or newer); this "
        "GPU is 8.0")
    card.capability = (9, 0)
    assert prec.unsupported_reason("fp8_tensorwise", GPU, {}) == (
        "this GPU does not support bf16 (needs compute capability >= 8.0)")
    card.bf16 = True
    assert prec.unsupported_reason("fp8_tensorwise", GPU, {}) is None


@pytest.mark.parametrize(("apex", "reason"), [
    ({}, "apex is not built: unknown"),
    ({"status": "failed", "reason": "nvcc missing"}, "apex is not built: nvcc missing"),
    ({"status": "built", "commit": "1234567"}, "apex commit 1234567 has no apex.amp (removed after tag 25.05); use "
                                               "ref 25.05"),
    ({"status": "built", "has_amp": False}, "apex commit None has no apex.amp (removed after tag 25.05); use ref "
                                            "25.05"),
    (BUILT, None),
])
def test_apex_needs_a_build_with_amp(card, apex, reason):
    assert prec.unsupported_reason("apex_o2", GPU, apex) == reason


@pytest.fixture
def tf32_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_configure_tf32_sets_both_flags_for_fp32_and_tf32_and_leaves_them_otherwise(tf32_flags):
    assert prec.configure_tf32("tf32") == {"matmul_allow_tf32": True, "cudnn_allow_tf32": True}
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    assert prec.configure_tf32("fp32") == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False}
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = True, False
    assert prec.configure_tf32("amp_bf16") == {"matmul_allow_tf32": True, "cudnn_allow_tf32": False}
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    assert prec.configure_tf32("apex_o1") == {"matmul_allow_tf32": False, "cudnn_allow_tf32": True}


# ---- the step ------------------------------------------------------------------------------------------------


class Recorder(torch.nn.Module):
    """A linear model that records the dtype of its output and whether it ran in training mode."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)
        self.seen = []

    def forward(self, x):
        out = self.linear(x)
        self.seen.append((out.dtype, self.training))
        return out


def batch():
    torch.manual_seed(1)
    return torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])


def make(precision, **kwargs):
    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return prec.Trainer(precision, model, optimizer, torch.nn.functional.cross_entropy, CPU, **kwargs)


def test_fp32_runs_without_autocast_or_scaler_and_steps_the_optimizer():
    trainer = make("fp32")
    assert (trainer.dtype, trainer.scaler, trainer.amp) == (None, None, None)
    assert (trainer.apex_cast_cache, trainer.apex_fused_kernels) == (None, None)
    before = trainer.model.linear.weight.detach().clone()
    bias = trainer.model.linear.bias.detach().clone()
    x, y = batch()
    with warnings.catch_warnings():
        # no autocast at all: torch.autocast to float32, not an autocast dtype, would warn "Disabling autocast"
        warnings.simplefilter("error")
        result = trainer.step(x, y)
        trainer.logits(x)
    expected = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, before, bias), y)
    assert result.scale is None and result.skipped is False
    assert not result.loss.requires_grad
    assert torch.isclose(result.loss, expected, atol=1e-6)
    assert not torch.equal(trainer.model.linear.weight, before)  # the optimizer stepped
    assert trainer.model.linear.weight.grad is None  # zero_grad(set_to_none=True) after the step
    assert trainer.model.seen == [(torch.float32, True), (torch.float32, False)]
    assert result.read_back() == (None, False)


def test_bf16_autocast_runs_the_model_in_bf16_and_logits_in_eval_mode():
    trainer = make("amp_bf16")
    assert trainer.dtype is torch.bfloat16 and trainer.scaler is None
    x, y = batch()
    trainer.step(x, y)
    assert trainer.model.seen == [(torch.bfloat16, True)]
    out = trainer.logits(x)
    assert out.dtype is torch.bfloat16 and not out.requires_grad
    assert trainer.model.seen[-1] == (torch.bfloat16, False)
    assert trainer.model.training  # back in training mode
    plain = make("fp32")
    assert plain.logits(x).dtype is torch.float32
    assert plain.model.seen == [(torch.float32, False)]


def test_fp16_amp_scales_the_loss_with_gradscaler_and_its_first_scale():
    assert make("amp_fp16").scaler.get_scale() == 65536.0
    trainer = make("amp_fp16", scaler_init_scale=16384)
    assert trainer.dtype is torch.float16
    assert trainer.scaler.get_scale() == 16384.0
    assert trainer.scaler._device == "cpu"  # the cell's device, not GradScaler's default cuda
    assert make("amp_bf16", scaler_init_scale=16384).scaler is None
    x, y = batch()
    before = trainer.model.linear.weight.detach().clone()
    result = trainer.step(x, y)
    assert trainer.model.seen == [(torch.float16, True)]
    assert result.read_back() == (16384.0, False)
    assert isinstance(result.scale, torch.Tensor)
    assert result.loss.dtype is torch.float32 and not result.loss.requires_grad
    assert not torch.equal(trainer.model.linear.weight, before)


def test_an_overflowing_fp16_step_is_skipped_and_reports_the_scale_it_used():
    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    trainer = prec.Trainer("amp_fp16", model, optimizer,
                           lambda out, y: torch.nn.functional.cross_entropy(out, y) * float("inf"), CPU,
                           scaler_init_scale=1024.0)
    before = model.linear.weight.detach().clone()
    result = trainer.step(*batch())
    assert result.read_back() == (1024.0, True)
    assert trainer.scaler.get_scale() == 512.0
    assert torch.equal(model.linear.weight, before)  # the step was skipped


def test_step_result_reads_back_tensors_and_plain_values():
    loss = torch.tensor(1.0)
    scale, skipped = prec.StepResult(loss, torch.tensor(8.0), torch.tensor(True)).read_back()
    assert (scale, skipped) == (8.0, True) and type(scale) is float and type(skipped) is bool
    assert prec.StepResult(loss, 4.0, False).read_back() == (4.0, False)
    assert prec.StepResult(loss, None, 0).read_back() == (None, False)


def test_a_wrapper_wraps_the_model_after_the_precision_is_set_up():
    wrapped = []
    trainer = make("fp32", wrap=lambda model: wrapped.append(model) or ("wrapped", model))
    assert trainer.model[0] == "wrapped" and wrapped == [trainer.model[1]]


def test_zero_grad_falls_back_for_an_optimizer_without_set_to_none():
    calls = []

    class Old:
        def zero_grad(self, **kwargs):
            calls.append(kwargs)
            if kwargs:
                raise TypeError("no set_to_none")

    trainer = make("fp32")
    trainer.optimizer = Old()
    trainer.zero_grad()
    assert calls == [{"set_to_none": True}, {}]


# ---- apex (a fake apex.amp) ------------------------------------------------------------------------------------


class FakeScaler:
    def __init__(self, scale, after):
        self.scale, self.after = scale, after

    def loss_scale(self):
        return self.scale


@pytest.fixture
def apex(monkeypatch):
    """sys.modules' apex: amp.initialize records its arguments; scale_loss multiplies by the loss scale."""
    seen = types.SimpleNamespace(initialize=[], scaled=[], cleared=0)
    handle = types.SimpleNamespace(_enable_caching=True)

    def clear():
        seen.cleared += 1

    handle._clear_cache = clear
    scaler = FakeScaler(128.0, 128.0)
    state = types.SimpleNamespace(handle=handle, loss_scalers=[scaler])

    def initialize(model, optimizer, **kwargs):
        seen.initialize.append((model, optimizer, kwargs))
        return model, optimizer

    @contextlib.contextmanager
    def scale_loss(loss, optimizer):
        seen.scaled.append((loss.detach().clone(), optimizer))
        yield loss * scaler.scale
        scaler.scale = scaler.after

    amp = types.SimpleNamespace(initialize=initialize, _amp_state=state, scale_loss=scale_loss)
    module = types.ModuleType("apex")
    module.amp = amp
    monkeypatch.setitem(sys.modules, "apex", module)
    monkeypatch.delitem(sys.modules, "apex.multi_tensor_apply", raising=False)
    seen.handle, seen.scaler, seen.module, seen.state = handle, scaler, module, state
    return seen


@pytest.mark.parametrize(("precision", "level"), [("apex_o1", "O1"), ("apex_o2", "O2"), ("apex_o3", "O3")])
def test_apex_gets_its_opt_level_and_nothing_else(apex, precision, level):
    wrapped = []
    trainer = make(precision, wrap=lambda model: wrapped.append(model) or model)
    [(model, optimizer, kwargs)] = apex.initialize
    assert kwargs == {"opt_level": level, "verbosity": 0}
    assert wrapped == [model] and trainer.optimizer is optimizer
    assert trainer.amp is apex.module.amp
    assert (trainer.dtype, trainer.scaler) == (None, None)


def test_apex_o1_keeps_its_cast_cache_unless_blocks_are_recomputed(apex):
    assert make("apex_o1").apex_cast_cache is True
    assert apex.handle._enable_caching is True
    assert make("apex_o1", recomputes=True).apex_cast_cache is False
    assert apex.handle._enable_caching is False


def test_apex_without_a_cast_cache_records_none(apex):
    del apex.handle._enable_caching
    assert make("apex_o2", recomputes=True).apex_cast_cache is None
    apex.state.handle = None
    assert make("apex_o2").apex_cast_cache is None
    del apex.state.handle
    assert make("apex_o2").apex_cast_cache is None


def test_apex_fused_kernels_are_what_multi_tensor_apply_says(apex, monkeypatch):
    assert make("apex_o1").apex_fused_kernels is None  # no multi_tensor_apply in this apex
    mta = types.ModuleType("apex.multi_tensor_apply")
    mta.multi_tensor_applier = types.SimpleNamespace(available=0)
    apex.module.multi_tensor_apply = mta
    monkeypatch.setitem(sys.modules, "apex.multi_tensor_apply", mta)
    assert make("apex_o1").apex_fused_kernels is False
    mta.multi_tensor_applier.available = 1
    assert make("apex_o1").apex_fused_kernels is True


def test_an_apex_step_scales_the_loss_and_reports_the_scale_it_used(apex):
    trainer = make("apex_o1")
    x, y = batch()
    before = trainer.model.linear.weight.detach().clone()
    result = trainer.step(x, y)
    assert result.read_back() == (128.0, False)
    assert len(apex.scaled) == 1 and apex.scaled[0][1] is trainer.optimizer
    assert torch.isclose(apex.scaled[0][0], result.loss)
    assert not torch.equal(trainer.model.linear.weight, before)
    assert trainer.model.linear.weight.grad is None
    assert apex.cleared == 1  # zero_grad emptied O1's cast cache
    apex.scaler.after = 64.0  # the scaler backs off: that step was skipped
    assert trainer.step(x, y).read_back() == (128.0, True)
    assert trainer.step(x, y).read_back() == (64.0, False)


def test_zero_grad_without_an_apex_handle_or_its_cache_is_fine(apex):
    trainer = make("apex_o2")
    del apex.handle._clear_cache
    trainer.zero_grad()
    apex.state.handle = None
    trainer.zero_grad()
    del apex.state.handle  # an amp state without a handle at all
    trainer.zero_grad()
    assert apex.cleared == 0
