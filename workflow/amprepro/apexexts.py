"""Which of apex's compiled extensions the run matrix's cells use: the full apex build compiles only those (issue 40).

Read from apex 25.05's Python sources (the pinned ref), one use of apex at a time:

- apex.amp (O1, O2, O3) needs amp_C. apex/multi_tensor_apply/multi_tensor_apply.py imports amp_C and sets
  `multi_tensor_applier.available`; apex/amp/scaler.py's LossScaler then takes amp_C.multi_tensor_scale and
  multi_tensor_axpby (unscaling, the inf check), and apex/amp/_process_optimizer.py takes amp_C.multi_tensor_scale and
  multi_tensor_l2norm for O2's master weights. Without amp_C apex.amp falls back to Python ("Using Python fallback"):
  that is the shell of issue 38, not the build the articles measured, so amp_C is needed.
- FusedAdam (train.apex_optimizer or train.optimizer `apex_fused_adam`) needs amp_C: apex/optimizers/fused_adam.py
  imports it for amp_C.multi_tensor_adam and raises "apex.optimizers.FusedAdam requires cuda extensions" without it.
- FusedLayerNorm (model setting fused_layer_norm) needs fused_layer_norm_cuda: apex/normalization/fused_layer_norm.py
  imports it with importlib.import_module("fused_layer_norm_cuda") when the module is built.

Nothing a cell does imports the others: apex_C only by apex.parallel.DistributedDataParallel's flatten
(apex/parallel/distributed.py, inside a function), syncbn only by apex.parallel.SyncBatchNorm (with a Python fallback
at import), the megatron softmaxes, fused_dense, mlp, fused_rotary_positional_embedding and
fused_weight_gradient_mlp_cuda only by apex.transformer, apex.fused_dense and apex.mlp, which no cell uses.
`import apex` itself needs none of them: the shell (no extension at all) imports it and trains O1/O2.

The names reach the build as checked values: NAME first, then membership in what the source's setup.py offers
(amprepro.env.apexbuild.pipeline). Torch-free: the Snakefile calls run_extensions at DAG build time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from amprepro import precisions
from amprepro.cellspec import CellSpec

# An extension module name as setup.py's CUDAExtension(name=...) gives it: a Python identifier, nothing else.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
AMP = ("amp_C",)
FUSED_ADAM = ("amp_C",)
FUSED_LAYER_NORM = ("fused_layer_norm_cuda",)


def cell_extensions(spec: CellSpec | dict) -> list[str]:
    """The compiled extensions this cell needs from the full apex build, sorted; [] for a cell that uses no apex or
    runs on the shell (which has none, by design)."""
    cell = CellSpec.of(spec)
    if not cell.needs_apex or cell.apex_build != "full":
        return []
    needed: set[str] = set()
    if precisions.get(cell.precision).needs_apex:
        needed.update(AMP)
    if cell.optimizer == "apex_fused_adam":
        needed.update(FUSED_ADAM)
    if cell.settings.fused_layer_norm:
        needed.update(FUSED_LAYER_NORM)
    return sorted(needed)


def run_extensions(cells: Iterable[CellSpec | dict]) -> list[str]:
    """Every extension any cell of the run matrix needs from the full build, sorted."""
    return sorted({name for cell in cells for name in cell_extensions(cell)})


def build_extensions(cells: Iterable[CellSpec | dict]) -> list[str]:
    """What the full build compiles for this run matrix: the extensions its cells use; for a matrix whose cells use no
    apex (the lora or fp8 preset), amp_C alone, so the environment record still shows a real apex.amp (not the shell)
    at a fraction of the cost: on a 16-core H200 box the lora preset's build of all 12 extensions ran over five minutes
    beside its cells (2026-12-04), while amp_C and fused_layer_norm_cuda built in 80-99 s."""
    return run_extensions(cells) or list(AMP)


def name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not NAME.match(name):
        return f"{name!r} is not an extension module name (a Python identifier of at most 64 characters)"
    return None


def missing(spec: CellSpec | dict, apex: dict) -> list[str]:
    """The extensions this cell needs that the apex build it was given left out; [] where it has them all, or where
    the record predates the selection (no extensions_built: the full set was built)."""
    built = apex.get("extensions_built")
    if apex.get("status") != "built" or apex.get("shell") or built is None:
        return []
    return [name for name in cell_extensions(spec) if name not in built]
