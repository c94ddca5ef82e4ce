"""GPU memory of a training cell: estimated before allocating (skip what cannot fit) and split after the first step.

Bytes per parameter (amprepro.train.precisions holds the figures), with an AdamW-type optimizer (two FP32 moments, 8
bytes):
- fp32, tf32: 4 weights + 4 gradients + 8 optimizer state.
- amp_fp16, amp_bf16 (torch.amp): the same, plus a 2-byte cast of each matmul weight that autocast caches for the
  forward (freed when the forward's autocast region ends, before the gradients exist: counting both makes the estimate
  an upper bound).
- apex_o1: fp32 weights like torch.amp, plus apex's 2-byte cast cache of each matmul weight, which apex keeps until
  scale_loss exits, after the backward (apex/amp/handle.py, 25.05).
- apex_o2: 2-byte FP16 model weights + 2-byte FP16 gradients + 4-byte FP32 master weights + 4-byte FP32 master
  gradients + 8 bytes FusedAdam state. Read from apex 25.05: _process_optimizer.lazy_init_with_master_weights clones
  every FP16 parameter into an FP32 master; post_backward_with_master_weights allocates an FP32 grad per master
  (empty_like) next to the FP16 grads, which zero_grad zeroes but keeps; FusedAdam allocates exp_avg and exp_avg_sq
  in FP32 (zeros_like(p).float()) for the masters. All five are alive together during the optimizer step.
"""

from __future__ import annotations

from amprepro.train import precisions

GIB = 2**30


def compute_bytes(precision: str) -> int:
    """Bytes per element of the matmul inputs and outputs under this precision."""
    return precisions.get(precision).compute_bytes


def residual_bytes(precision: str) -> int:
    """The residual stream stays FP32 under autocast (FP32 embedding + half-precision branch promotes); O2 is FP16."""
    return precisions.get(precision).residual_bytes


def llama_activation_bytes(model, batch_size: int, seq_len: int, precision: str) -> int:
    """Activations with one checkpoint per block: every block's input is kept, one block is recomputed at a time (its
    saved tensors and their gradients), and the logits with cross-entropy's FP32 copies. An approximation from the
    shapes; the measured split is memory_breakdown_bytes."""
    tokens, dim, ffn = batch_size * seq_len, model.dim, model.ffn_dim
    block_inputs = model.layers * tokens * dim * residual_bytes(precision)
    # qkv (3 dim), rotated q and k (2), attention output (1), two norm outputs (2), gate/up (2 ffn), silu and product
    # (2 ffn), plus the two FP32 norm inputs; x2 for the gradients flowing through the block.
    saved = tokens * ((8 * dim + 4 * ffn) * compute_bytes(precision) + 2 * dim * 4)
    logits = tokens * model.vocab_size * (compute_bytes(precision) + 4 + 4 + 4)  # logits, .float(), softmax, grad
    return block_inputs + 2 * saved + logits


def estimate(parameters: int, matmul_parameters: int, precision: str, activations: int,
             free_bytes: int | None) -> dict:
    weights, grads, state, master, cast = precisions.get(precision).bytes_per_parameter
    parts = {
        "weights_bytes": weights * parameters,
        "gradients_bytes": grads * parameters,
        "optimizer_state_bytes": state * parameters,
        "master_weights_bytes": master * parameters,
        "cast_cache_bytes": cast * matmul_parameters,
        "activations_bytes": activations,
    }
    return {**parts, "total_bytes": sum(parts.values()), "free_bytes_at_start": free_bytes}


def free_bytes(device) -> int | None:
    """Free memory on the GPU now (torch.cuda.mem_get_info); None on the CPU."""
    import torch

    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def estimate_for_cell(model_config: dict, precision: str, device) -> dict | None:
    """The estimate of a cell whose model has one (the LLaMA decoders), from a meta-device build: no allocation."""
    from amprepro.train import models

    if model_config["arch"] not in models.LLAMA_SIZES:
        return None
    model = models.build(model_config["arch"], model_config)
    activations = llama_activation_bytes(model, model_config["batch_size"], model.seq_len, precision)
    return estimate(models.parameter_count(model), model.matmul_parameters(), precision, activations,
                    free_bytes(device))


def does_not_fit(estimate: dict | None) -> bool:
    return bool(estimate and estimate["free_bytes_at_start"] is not None
                and estimate["total_bytes"] > estimate["free_bytes_at_start"])


def gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


def describe(estimate: dict) -> str:
    return (f"estimated need {gib(estimate['total_bytes'])} (weights {gib(estimate['weights_bytes'])}, gradients "
            f"{gib(estimate['gradients_bytes'])}, optimizer state {gib(estimate['optimizer_state_bytes'])}, master "
            f"weights {gib(estimate['master_weights_bytes'])}, cast cache {gib(estimate['cast_cache_bytes'])}, "
            f"activations {gib(estimate['activations_bytes'])})")


def skip_record(base: dict, estimate: dict) -> dict:
    return {**base, "status": "skipped", "skip_cause": "machine",
            "reason": f"does not fit: {describe(estimate)} exceeds the {gib(estimate['free_bytes_at_start'])} free "
                      "on this GPU at start; run it on a GPU with more memory"}


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
