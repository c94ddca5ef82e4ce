"""amprepro: the Python logic behind the Snakemake rules."""

PRECISIONS = ("fp32", "tf32", "amp_fp16", "amp_bf16", "apex_o1", "apex_o2")
