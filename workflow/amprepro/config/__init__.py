"""Read and check a config, resolve the run matrix: one validation pass before any job, field-naming messages.

  python -m amprepro.config check FILE [FILE ...]   # what `snakemake --configfile FILE ...` would run, run nothing

Every check here happens at DAG build time, before Snakemake touches an output (docs/config.md). Its modules, by job;
this package's names are what the Snakefile, the rules and the tests import:
- errors: ConfigError, and the Snakefile's stop on one (its message alone);
- reading: a config file read as Snakemake would, without evaluating anything;
- schema: the config made what YAML users meant, validated against the schema with its defaults filled in;
- runs: the GPUs the jobs see, the preset chosen, the user's runs merged in and every model checked;
- checks: the checks across fields of one model's settings;
- largestbatch: runs.largest_batch's check, its searches and their time budget;
- matrix: the run matrix's cells and each cell's settings (amprepro.cellspec);
- cli: the command line above (`python -m amprepro.config` runs it).
"""

from amprepro.config.checks import (
    LLAMA_ARCHS,
    check_apex_source,
    check_batch,
    check_lora,
    check_model_settings,
)
from amprepro.config.errors import ConfigError, stop_on_config_error
from amprepro.config.largestbatch import check_largest_batch, largest_batch_searches, largest_batch_seconds
from amprepro.config.matrix import cell_spec, cell_spec_dict, cell_spec_json, cells, plan_cells
from amprepro.config.reading import read_config_file
from amprepro.config.runs import apex_required, choose_preset, gpu_memory_limit, gpus_for_jobs, resolve_runs
from amprepro.config.schema import load_schema, normalized, validate, validate_config
from amprepro.presets import deep_merge

__all__ = [
    "LLAMA_ARCHS", "ConfigError", "apex_required", "cell_spec", "cell_spec_dict", "cell_spec_json", "cells",
    "check_apex_source", "check_batch", "check_largest_batch", "check_lora", "check_model_settings", "choose_preset",
    "deep_merge", "gpu_memory_limit", "gpus_for_jobs", "largest_batch_searches", "largest_batch_seconds",
    "load_schema", "normalized", "plan_cells", "read_config_file", "resolve_runs", "stop_on_config_error", "validate",
    "validate_config",
]
