"""The precisions, one entry each: every property any stage needs, written once.

The config schema's precision enum, the claims schema, the report's order, labels and colours, the training step
(autocast dtype, GradScaler, TF32, apex opt level, torch.compile, torchao float8 recipe), the skip rules (compute
capability, torchao), the MFU peak and the memory estimate all read this table, so a
new precision is one new entry here. No torch import: the DAG build and the report read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

# Which nn.Linear layers an FP8 cell converts (amprepro.train.float8 applies it; why each condition: its docstring).
# Here, not there, because the report states it and the report's env has no torch.
FP8_MIN_DIM = 256
FP8_OUTPUT_LAYERS = ("lm_head", "head", "heads.head")
FP8_FILTER = (f"nn.Linear with both dims multiples of 16 and >= {FP8_MIN_DIM}, not the output layer "
              f"({', '.join(FP8_OUTPUT_LAYERS)}), not nn.MultiheadAttention's out_proj")


@dataclass(frozen=True)
class Precision:
    name: str
    label: str  # what the claims and the report call it
    color: str  # its colour in the report's figures
    peak_kind: str  # the matmul dtype that dominates its compute: a column of flops.DATASHEET_TFLOPS
    autocast_dtype: str | None = None  # torch dtype name torch.autocast runs under; None: no torch.autocast
    grad_scaler: bool = False  # torch.amp.GradScaler around the step
    tf32: bool | None = None  # set matmul and cuDNN allow_tf32 to this; None keeps PyTorch's defaults
    apex_opt_level: str | None = None  # apex.amp.initialize's opt_level; None: not an apex precision
    # Bytes per parameter (weights, gradients incl. master gradients, optimizer state, master weights, cast cache per
    # matmul weight), with an AdamW-type optimizer: amprepro.memory explains each figure.
    bytes_per_parameter: tuple[int, int, int, int, int] = (4, 4, 8, 0, 0)
    compute_bytes: int = 4  # bytes per element of matmul inputs and outputs
    residual_bytes: int = 4  # bytes per element of the residual stream
    compile: bool = False  # the training step runs the model through torch.compile (amprepro.train.float8.compile)
    float8_recipe: str | None = None  # torchao Float8LinearConfig.from_recipe_name; None: no FP8 matmuls
    min_capability: tuple[int, int] | None = None  # the CUDA compute capability the precision's matmuls need
    baseline: str | None = None  # the precision its speedup, memory and per-step loss are compared with, same model
    # and seed (summary's *_vs_baseline columns, amprepro.analysis.fp8); None: only strict FP32 and TF32

    @property
    def needs_apex(self) -> bool:
        return self.apex_opt_level is not None

    @property
    def needs_torchao(self) -> bool:
        return self.float8_recipe is not None


REGISTRY: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", "strict FP32", "#4c566a", "fp32", tf32=False),
        Precision("tf32", "TF32", "#8f9bb3", "tf32", tf32=True),
        Precision("amp_fp16", "fp16 AMP", "#d1495b", "fp16", autocast_dtype="float16", grad_scaler=True,
                  bytes_per_parameter=(4, 4, 8, 0, 2), compute_bytes=2),
        # fp16 autocast with no loss scaler: the recipe timm's benchmark.py times, so that issue 40's harness
        # comparison (tools/gpu/timm_compare.py) times our harness on the same work; no preset runs it. Without a
        # scaler a small fp16 gradient underflows to zero, the risk the articles' GradScaler answers.
        Precision("amp_fp16_unscaled", "fp16 AMP, no loss scaler", "#e6859a", "fp16", autocast_dtype="float16",
                  bytes_per_parameter=(4, 4, 8, 0, 2), compute_bytes=2),
        Precision("amp_bf16", "bf16 AMP", "#edae49", "bf16", autocast_dtype="bfloat16",
                  bytes_per_parameter=(4, 4, 8, 0, 2), compute_bytes=2),
        Precision("apex_o1", "apex O1", "#00798c", "fp16", apex_opt_level="O1",
                  bytes_per_parameter=(4, 4, 8, 0, 2), compute_bytes=2),
        Precision("apex_o2", "apex O2", "#30638e", "fp16", apex_opt_level="O2",
                  bytes_per_parameter=(2, 2 + 4, 8, 4, 0), compute_bytes=2, residual_bytes=2),
        # apex O3 (issue 38): "Pure FP16 training" as apex 25.05's frontend.O3 sets it: model.half() with
        # keep_batchnorm_fp32=False (BatchNorm in FP16 too), master_weights=False (no FP32 copy: the optimizer steps the
        # FP16 weights, and torch's AdamW keeps its two moments in the parameters' dtype, FP16), loss_scale=1.0 (no
        # loss scaling: apex.amp.initialize is called with O3's defaults, so a small gradient underflows). Bytes per
        # parameter: FP16 weights 2, FP16 gradients 2, two FP16 moments 4, no master weights, no cast cache.
        Precision("apex_o3", "apex O3", "#1b3a4b", "fp16", apex_opt_level="O3",
                  bytes_per_parameter=(2, 2, 4, 0, 0), compute_bytes=2, residual_bytes=2),
        # FP8 (issue 26, docs/fp8.md): torchao float8 training on the qualifying nn.Linear layers, torch.compile on,
        # bf16 autocast for the rest; compared with bf16 AMP compiled the same way (compiled against compiled).
        # Memory figures as bf16 AMP's (FP32 weights and AdamW state, a 16-bit cast per matmul weight): an upper
        # bound, torchao keeps FP8 (1-byte) copies of the weights and of the inputs it saves for the backward.
        Precision("amp_bf16_compile", "bf16 AMP, compiled", "#c9a227", "bf16", autocast_dtype="bfloat16",
                  bytes_per_parameter=(4, 4, 8, 0, 2), compute_bytes=2, compile=True, baseline="amp_bf16"),
        Precision("fp8_tensorwise", "FP8 tensorwise (torchao)", "#6a4c93", "fp8", autocast_dtype="bfloat16",
                  bytes_per_parameter=(4, 4, 8, 0, 2), compute_bytes=2, compile=True, float8_recipe="tensorwise",
                  min_capability=(8, 9), baseline="amp_bf16_compile"),
        Precision("fp8_rowwise", "FP8 rowwise (torchao)", "#9d79bc", "fp8", autocast_dtype="bfloat16",
                  bytes_per_parameter=(4, 4, 8, 0, 2), compute_bytes=2, compile=True, float8_recipe="rowwise",
                  min_capability=(8, 9), baseline="amp_bf16_compile"),
    )
}
"""In the report's order: baselines first, then torch.amp, then apex, then the compiled bf16 and FP8 ones."""


def names() -> list[str]:
    """Every precision name, in the report's order."""
    return list(REGISTRY)


def get(name: str) -> Precision:
    return REGISTRY[name]


def label(name: str) -> str:
    return REGISTRY[name].label


def color(name: str, default: str | None = None) -> str | None:
    """Its colour in the report's figures; default for a name that is not a precision."""
    return REGISTRY[name].color if name in REGISTRY else default
