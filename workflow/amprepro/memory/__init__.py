"""The memory model: the GPU memory a training cell will hold at its peak, from the model's shape, the batch and the
precision, before anything is allocated. One home for the formulas: the memory plan (amprepro.plan.memplan), the cell's
own does-it-fit check, the LLaMA shape ladder and the report read it. No torch import: it runs at plan time, in the
report and in CI, where torchvision may not even load.

Its modules, by job (each docstring has its rules); this package's names are what its readers import:
- cellpeak: one cell's parts at each moment of a step and the largest (estimate, llama_estimate), the headroom;
- shapes: the arch registry's shapes as the model reads them, and each family's parameter count;
- activations: the activations of every family but the LLaMA's;
- llama: a LLaMA's activations, tensor by tensor, and its moments beyond the model states;
- regimes: the regimes' types beyond one GPU with FP32 master weights (Sharding, Lora, bf16 weights);
- text: bytes and estimates in words.
The committed H200 reference checks every cell against this (tests/backbone/test_memory_model.py): within 15 % of
the measured allocator peak.
"""

from amprepro.memory.activations import resnet50_bytes_per_item, transformer_block_bytes_per_token
from amprepro.memory.cellpeak import (
    FAMILIES,
    HEADROOM,
    IN_PLACE_OPTIMIZERS,
    WORKSPACE_BYTES,
    Estimate,
    activation_bytes,
    cell_batch,
    estimate,
    llama_estimate,
    parameters,
    within_headroom,
)
from amprepro.memory.llama import (
    korthikanti_layer_bytes,
    korthikanti_terms,
    llama_activation_bytes,
    llama_backward_end_bytes,
    llama_block_bytes,
    llama_block_terms,
    llama_head_bytes,
)
from amprepro.memory.regimes import (
    BF16_WEIGHTS,
    LORA_TARGETS,
    MODEL_ONLY_PRECISIONS,
    UNSHARDED,
    Lora,
    Sharding,
    lora_of,
    precision_of,
)
from amprepro.memory.shapes import (
    LLAMA_LADDER,
    LLAMA_NAMES,
    LLAMA_SHAPES,
    RESNET50,
    VIT_B_16,
    is_llama,
    kv_dim,
    llama_linear_shapes,
    llama_parameters,
    llama_shape,
    llama_unit_parameters,
    lora_parameters,
    vit_tokens,
)
from amprepro.memory.text import GIB, describe, describe_record, gib

__all__ = [
    "BF16_WEIGHTS", "FAMILIES", "GIB", "HEADROOM", "IN_PLACE_OPTIMIZERS", "LLAMA_LADDER", "LLAMA_NAMES", "LLAMA_SHAPES",
    "LORA_TARGETS", "MODEL_ONLY_PRECISIONS", "RESNET50", "UNSHARDED", "VIT_B_16", "WORKSPACE_BYTES", "Estimate", "Lora",
    "Sharding", "activation_bytes", "cell_batch", "describe", "describe_record", "estimate", "gib", "is_llama",
    "korthikanti_layer_bytes", "korthikanti_terms", "kv_dim", "llama_activation_bytes", "llama_backward_end_bytes",
    "llama_block_bytes", "llama_block_terms", "llama_estimate", "llama_head_bytes", "llama_linear_shapes",
    "llama_parameters", "llama_shape", "llama_unit_parameters", "lora_of", "lora_parameters", "parameters",
    "precision_of", "resnet50_bytes_per_item", "transformer_block_bytes_per_token", "vit_tokens", "within_headroom",
]
