"""The precisions of amprepro.precisions as one training-step interface, chosen by name (as timm's train.py
chooses by flag)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from amprepro import precisions


@dataclass
class StepResult:
    loss: torch.Tensor
    scale: float | torch.Tensor | None  # a GPU tensor is read back after the step, not inside it
    skipped: bool | torch.Tensor

    def read_back(self) -> tuple[float | None, bool]:
        scale = float(self.scale) if isinstance(self.scale, torch.Tensor) else self.scale
        return scale, bool(self.skipped)


def unsupported_reason(precision: str, device: torch.device, apex: dict) -> str | None:
    """Why this machine or build cannot run the precision; None when it can."""
    on_cuda, spec = device.type == "cuda", precisions.get(precision)
    if spec.min_capability:  # FP8: before the bf16 check, which would ask a CPU-only torch about CUDA
        from amprepro.train import float8

        reason = float8.capability_reason(precision, device)
        if reason:
            return reason
    if spec.tf32:
        if not on_cuda:
            return "TF32 is a Tensor Core mode of NVIDIA GPUs (compute capability >= 8.0); no CUDA GPU here"
        if torch.cuda.get_device_capability(device)[0] < 8:
            return f"TF32 needs compute capability >= 8.0; this GPU is {torch.cuda.get_device_capability(device)}"
    if spec.grad_scaler and not on_cuda:
        return "fp16 AMP with GradScaler is the CUDA recipe the articles measure; no CUDA GPU here"
    if spec.autocast_dtype == "float16" and not on_cuda:
        return "fp16 autocast with no loss scaler is timm benchmark.py's CUDA recipe; no CUDA GPU here"
    if spec.autocast_dtype == "bfloat16" and on_cuda and not torch.cuda.is_bf16_supported():
        return "this GPU does not support bf16 (needs compute capability >= 8.0)"
    if spec.needs_apex:
        if not on_cuda:
            return "apex.amp runs on CUDA GPUs only; no CUDA GPU here"
        if apex.get("status") != "built":
            return f"apex is not built: {apex.get('reason', 'unknown')}"
        if not apex.get("has_amp"):
            return f"apex commit {apex.get('commit')} has no apex.amp (removed after tag 25.05); use ref 25.05"
    return None


def configure_tf32(precision: str) -> dict:
    """Strict fp32 turns TF32 off for matmul and cuDNN; tf32 turns both on; AMP keeps PyTorch's defaults."""
    tf32 = precisions.get(precision).tf32
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


class Trainer:
    """Forward, backward and optimizer step under one precision; reports loss, loss scale and skipped steps."""

    def __init__(self, precision: str, model, optimizer, loss_fn, device: torch.device, wrap=None,
                 recomputes: bool = False, scaler_init_scale: float | None = None):
        """scaler_init_scale: GradScaler's first loss scale (train setting grad_scaler_init_scale, the second
        article's remedy GradScaler(init_scale=2.**14)); None keeps torch's 2**16. amprepro.config refuses it for a
        precision without a GradScaler."""
        self.precision, self.device, self.loss_fn = precision, device, loss_fn
        spec = precisions.get(precision)
        self.dtype = getattr(torch, spec.autocast_dtype) if spec.autocast_dtype else None
        scaler_args = {} if scaler_init_scale is None else {"init_scale": float(scaler_init_scale)}
        self.scaler = torch.amp.GradScaler(device.type, **scaler_args) if spec.grad_scaler else None
        self.amp, self.apex_cast_cache, self.apex_fused_kernels = None, None, None
        if spec.needs_apex:
            from apex import amp

            # O3 takes apex's own defaults (pure FP16, loss_scale 1.0), as O1 and O2 do: only the opt level is passed
            model, optimizer = amp.initialize(model, optimizer, opt_level=spec.apex_opt_level, verbosity=0)
            self.amp = amp
            self.apex_cast_cache = self._apex_cast_cache(recomputes)
            # False in the apex shell (no amp_C): loss scaling and O2's master-weight copies take apex's Python
            # fallback (apex/amp/scaler.py "Using Python fallback"); the cell records which ran
            self.apex_fused_kernels = self._apex_fused_kernels()
        # DDP wraps after amp.initialize, as apex requires.
        self.model, self.optimizer = (wrap(model) if wrap else model), optimizer

    @staticmethod
    def _apex_fused_kernels() -> bool | None:
        """Whether apex's multi-tensor kernels (amp_C) loaded; None where this apex has no multi_tensor_apply to ask."""
        try:
            from apex import multi_tensor_apply
        except ImportError:
            return None
        return bool(multi_tensor_apply.multi_tensor_applier.available)

    def _apex_cast_cache(self, recomputes: bool) -> bool | None:
        """O1 caches each weight's FP16 cast for the step. A weight cast twice in one step (activation checkpointing
        recomputes every block in the backward) is looked up again, and apex 25.05 then checks the cast's autograd
        parent at grad_fn.next_functions[1], which torch 2.x's single-input cast node does not have: IndexError
        (seen on the H200, llama7b, 2026-11-30). Without the cache every use casts again, as O2 and torch.amp do."""
        handle = getattr(self.amp._amp_state, "handle", None)
        if handle is None or not hasattr(handle, "_enable_caching"):
            return None  # O2 has no cast cache
        if recomputes:
            handle._enable_caching = False
        return handle._enable_caching

    def forward_loss(self, x, y):
        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            return self.loss_fn(self.model(x), y)

    def step(self, x, y) -> StepResult:
        loss = self.forward_loss(x, y)
        if self.scaler is not None:
            result = self._scaled_step(loss)
        elif self.amp is not None:
            result = self._apex_step(loss)
        else:
            loss.backward()
            self.optimizer.step()
            result = StepResult(loss.detach(), None, False)
        self.zero_grad()
        return result

    def zero_grad(self) -> None:
        try:
            self.optimizer.zero_grad(set_to_none=True)
        except TypeError:  # apex's FusedAdam and O2's patched zero_grad take no set_to_none
            self.optimizer.zero_grad()
        if self.amp is None:
            return
        # O1's cast cache is only emptied by scale_loss: a backward outside it (FLOP counting) leaves casts behind
        # that break the next forward (IndexError in apex.amp.utils.cached_cast).
        handle = getattr(self.amp._amp_state, "handle", None)
        if handle is not None and hasattr(handle, "_clear_cache"):
            handle._clear_cache()

    def _scaled_step(self, loss) -> StepResult:
        scaled = self.scaler.scale(loss)  # creates the scale tensor on first use
        # A device copy, compared on the device: get_scale() would stall the GPU queue twice per step (measured on
        # the H200: ~1 ms of a 54 ms ViT-B/16 step).
        used = self.scaler._get_scale_async().clone()
        scaled.backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return StepResult(loss.detach(), used, self.scaler._get_scale_async() < used)

    def _apex_step(self, loss) -> StepResult:
        scaler = self.amp._amp_state.loss_scalers[0]
        scale = float(scaler.loss_scale())
        with self.amp.scale_loss(loss, self.optimizer) as scaled:
            scaled.backward()
        self.optimizer.step()
        return StepResult(loss.detach(), scale, float(scaler.loss_scale()) < scale)

    @torch.no_grad()
    def logits(self, x):
        self.model.eval()
        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            out = self.model(x)
        self.model.train()
        return out
