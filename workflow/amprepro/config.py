"""Read and check a config, resolve the run matrix: one validation pass before any job, field-naming messages.

  python -m amprepro.config check FILE [FILE ...]   # what `snakemake --configfile FILE ...` would run, run nothing

Every check here happens at DAG build time, before Snakemake touches an output (docs/config.md).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import difflib
import functools
import math
import re
import sys
from pathlib import Path

import jsonschema
import yaml

from amprepro import archs, precisions, presets
from amprepro.cellspec import CellSpec
from amprepro.datakinds import largest_batch
from amprepro.gpuslots import visible_gpus
from amprepro.presets import deep_merge
from amprepro.safevalues import apex_problems, shorten
from amprepro.schemaerrors import bounded_message, field_name, first_error

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "workflow" / "schemas" / "config.schema.yaml"
LLAMA_ARCHS = tuple(archs.where(family="llama"))  # a view of the arch registry (amprepro.archs)
MAX_NODES = 100_000  # values in a config; YAML aliases can expand a small file into a huge structure
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\Z")


class ConfigError(ValueError):
    """A config value is wrong; the message names the field and the fix."""


@contextlib.contextmanager
def stop_on_config_error():
    """Around the Snakefile's config reading: a ConfigError ends Snakemake with its message alone. Snakemake prints
    any exception raised in a Snakefile with its Python frames ("File .../config.py, line 199"), which say nothing to
    someone fixing a config value; SystemExit passes through it."""
    try:
        yield
    except ConfigError as exc:
        print(f"amprepro: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def gpus_for_jobs(setting, probe=visible_gpus) -> tuple[list[str], str]:
    """The GPUs the jobs will see: nvidia-smi here (auto), or what the config says (a login node submitting to GPUs)."""
    setting = {"true": True, "false": False}.get(setting, setting)  # `--config gpu=true` arrives as a string
    if setting is True:
        return ["configured GPU"], "the config says the jobs run on GPU nodes (gpu: true)"
    if setting is False:
        return [], "the config says the jobs run without a GPU (gpu: false)"
    return probe()


def choose_preset(requested: str, gpus: list[str], probe: str) -> dict:
    if requested != "auto":
        return {"preset": requested, "reason": f"preset: {requested} set in the config"}
    if gpus:
        return {"preset": "paper", "reason": f"preset: auto chose paper because {probe}"}
    return {"preset": "smoke", "reason": f"preset: auto chose smoke because {probe}"}


def load_schema() -> dict:
    """The config schema, its precision enum read from amprepro.precisions and its arch and LLaMA shape enums
    from amprepro.archs (the YAML does not repeat the lists); a copy of its own, for a caller may change it."""
    schema = copy.deepcopy(_schema_file(SCHEMA_PATH, SCHEMA_PATH.stat().st_mtime_ns))
    schema["$defs"]["precision"]["enum"] = precisions.names()
    schema["$defs"]["model"]["properties"]["arch"]["enum"] = archs.names()
    schema["$defs"]["model"]["properties"]["shape"]["enum"] = archs.ladder_keys()
    return schema


@functools.lru_cache(maxsize=4)
def _schema_file(path: Path, mtime_ns: int) -> dict:
    """One parse per DAG build, not one per check (four at each Snakemake start)."""
    return yaml.safe_load(path.read_text())


def _filling_defaults(validator_class):
    """The validator that also sets each absent property's schema default, as snakemake.utils.validate does."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, fields, instance, schema):
        if isinstance(instance, dict):
            for name, field in fields.items():
                if "default" in field:
                    instance.setdefault(name, copy.deepcopy(field["default"]))
        yield from check_properties(validator, fields, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": properties})


def read_config_file(path: str | Path) -> dict:
    """A config file as Snakemake would read it, without evaluating anything; ConfigError with file, line and column."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}). "
                          "Fix: check the path and its permissions.") from None
    except UnicodeDecodeError as exc:
        line, column = _position(exc.object, exc.start)
        raise ConfigError(f"{path}, line {line}, column {column}: byte 0x{exc.object[exc.start]:02x} is not UTF-8. "
                          "Fix: save the file as UTF-8.") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_message(path, exc)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: holds a {type(loaded).__name__}, not keys and values. Fix: write it as "
                          "`key: value` lines (preset:, runs:, apex:, ...), as config/config.yaml does.")
    if "__use_yte__" in loaded:
        raise ConfigError(f"{path}: sets __use_yte__, which makes Snakemake evaluate the file as a template with "
                          "Python expressions. Fix: remove __use_yte__ and write plain values (docs/config.md).")
    return loaded


def _position(data: bytes, offset: int) -> tuple[int, int]:
    before = data[:offset]
    return before.count(b"\n") + 1, offset - (before.rfind(b"\n") + 1) + 1


# A construct PyYAML reads until it is closed: a missing closing quote or bracket is found only where the reading
# ends (often the end of the file), so the line to show is where the construct opened (the error's context mark).
UNCLOSED = {"while scanning a quoted scalar": ("a quoted value", "its closing quote"),
            "while parsing a flow sequence": ("a [ list", "its ]"),
            "while parsing a flow mapping": ("a { mapping", "its }")}


def _yaml_message(path: Path, exc: yaml.YAMLError) -> str:
    problem_mark, context_mark = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    unclosed = UNCLOSED.get(getattr(exc, "context", None) or "")
    if unclosed and context_mark is not None:
        what, closing = unclosed
        stopped = f"line {problem_mark.line + 1}" if problem_mark is not None else "the end"
        return (f"{path}, line {context_mark.line + 1}, column {context_mark.column + 1}: not valid YAML ({what} "
                f"starts here and is not closed; the reader stopped at {stopped}: {shorten(problem, 80)}). "
                f"Fix: add {closing} on that line, or quote the value.")
    mark = problem_mark or context_mark
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    if "\t" in problem or "'\\t'" in problem:
        fix = "indent with spaces; YAML does not allow tabs there."
    else:
        fix = ("check the indentation, brackets and quotes on that line or the one before "
               "(a value with ': ' or ' #' needs quotes).")
    return f"{where}: not valid YAML ({shorten(problem, 120)}). Fix: {fix}"


def normalized(config: dict) -> dict:
    """The config with what YAML users write made what they meant, by the schema: `lr: 1e-3` (YAML 1.1 text) a number,
    a section left empty ({} not null), and nested `--config` values (which Snakemake passes as text) parsed as YAML."""
    schema = load_schema()
    _check_size(config)
    return _coerce(config, schema, schema)


def _check_size(config: dict) -> None:
    count, stack = 0, [config]
    while stack:
        value = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigError(f"Config error at config: more than {MAX_NODES} values (YAML aliases that expand?). "
                              "Fix: write the config out plainly; a real one has a few hundred.")
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _coerce(value, node: dict, schema: dict):
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else types
    if value is None and types == ["object"]:
        return {}
    if isinstance(value, dict):
        fields, others = node.get("properties", {}), node.get("additionalProperties")
        return {key: _coerce(item, fields.get(key, others if isinstance(others, dict) else {}), schema)
                for key, item in value.items()}
    if isinstance(value, list):
        return [_coerce(item, node.get("items", {}), schema) for item in value]
    # A nested --config value arrives as text ('-8'): read as YAML when that gives a valid value, or one of the type
    # the field wants (an integer out of range), so that it is checked as the same value in a file would be. A field
    # that takes a number or its text (gpu_memory_limit_gib: "12") is read as the number whenever the text is one,
    # so that its range holds in every spelling: the schema's minimum applies to numbers only, and "0" passed it.
    if (isinstance(value, str) and (parsed := _scalar(value)) is not value
            and (_valid(parsed, node, schema) or _of_type(parsed, types))
            and (not _valid(value, node, schema) or parsed is None or _is_number(parsed, types))):
        value = parsed
    if isinstance(value, float) and value.is_integer() and "integer" in types and "number" not in types:
        return int(value)
    return value


def _scalar(text: str):
    """text as a YAML scalar (1.2-style numbers too: 1e-3); text itself when it is not one."""
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(parsed, str) and NUMBER.match(parsed):
        return float(parsed)
    return parsed if parsed is None or isinstance(parsed, (bool, int, float)) else text


def _is_number(value, types: list[str]) -> bool:
    """value is a number (not a boolean) and the field takes numbers."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool({"number", "integer"} & set(types))


def _of_type(value, types: list[str]) -> bool:
    """value has one of the JSON-schema types (booleans are not numbers); False when the field names no type."""
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER
    return any(checker.is_type(value, name) for name in types if name != "string")


def _valid(value, node: dict, schema: dict) -> bool:
    resolved = {"$defs": schema["$defs"], **node}
    return jsonschema.Draft202012Validator(resolved).is_valid(value)


def validate(instance: dict, definition: str | None, prefix: str, defaults: bool = False) -> None:
    """Validate against the schema (or one of its $defs); raise ConfigError naming the first bad field. With defaults,
    fill in the schema's default of each absent property on the way (instance is changed in place)."""
    schema = load_schema()
    if definition:
        schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    validator_class = jsonschema.Draft202012Validator
    validator = (_filling_defaults(validator_class) if defaults else validator_class)(schema)
    error = first_error(validator, instance)
    if error is not None and error.validator == "additionalProperties" and isinstance(error.instance, dict):
        raise ConfigError(unknown_key_message(error, field_name(error, prefix)))
    if error is not None:
        raise ConfigError(
            f"Config error at {field_name(error, prefix)}: {bounded_message(error)}. "
            f"Fix that value in your config (allowed values are in {SCHEMA_PATH.name})."
        )


def unknown_key_message(error: jsonschema.ValidationError, where: str) -> str:
    """A key the schema does not know, with the closest known one ("did you mean") and the keys allowed there."""
    known = list(error.schema.get("properties", {}))
    unknown = [key for key in error.instance if key not in known]
    key = unknown[0] if unknown else "?"
    shown = shorten(key, 80)
    allowed = ", ".join(known) if known else "none"
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    if close:
        return (f"Config error at {where}: unknown key {shown}. Did you mean `{close[0]}`? Fix: rename it to "
                f"{close[0]} (the keys allowed in {where}: {allowed}).")
    return (f"Config error at {where}: unknown key {shown}. Fix: remove it, or use one of the keys allowed in "
            f"{where}: {allowed} ({SCHEMA_PATH.name}).")


def refuse_quoted_numbers(config: dict, command_line: dict | None, schema: dict | None = None) -> None:
    """A quoted integer or boolean in a config file (`seeds: ["0", "1"]`) is text where the schema wants a number:
    refused, naming the field, as any other type error. The same text from `--config` is fine: Snakemake passes every
    nested `--config` value as text (normalized() reads it as YAML). YAML 1.1 floats such as `lr: 1e-3`, which PyYAML
    reads as text though nobody quoted them, stay accepted."""
    schema = schema or load_schema()

    def walk(value, node, given, where):
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        if given is True:  # the whole value came from the command line
            return
        if isinstance(value, dict):
            fields, others = node.get("properties", {}), node.get("additionalProperties")
            for key, item in value.items():
                inner = given.get(key) if isinstance(given, dict) and key in given else None
                if isinstance(given, dict) and key in given and not isinstance(given[key], dict):
                    inner = True
                walk(item, fields.get(key, others if isinstance(others, dict) else {}), inner, f"{where}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, node.get("items", {}), given, f"{where}[{i}]")
        elif isinstance(value, str):
            types = node.get("type", [])
            types = [types] if isinstance(types, str) else types
            parsed = _scalar(value)
            if ("integer" in types or "boolean" in types) and "string" not in types and not isinstance(
                    parsed, float) and isinstance(parsed, (int, bool)):
                wanted = " or ".join({"integer": "an integer", "boolean": "true/false", "number": "a number"}.get(t, t)
                                     for t in types if t != "null")
                written = str(parsed).lower() if isinstance(parsed, bool) else parsed
                raise ConfigError(f"Config error at {where}: {value!r} is text (it is quoted in the file), where "
                                  f"{wanted} is wanted. Fix: write {written} without quotes.")

    walk(config, schema, dict(command_line or {}), "config")


def refuse_non_finite(value, where: str = "config") -> None:
    """YAML's .nan and .inf are numbers that no range check refuses (NaN compares false with every bound): no field
    means them."""
    if isinstance(value, dict):
        for key, item in value.items():
            refuse_non_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            refuse_non_finite(item, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"Config error at {where}: {value} is not a finite number. Fix: write a number such as 1 or "
                          "0.5 (see config.schema.yaml for its range).")


def validate_config(config: dict, command_line: dict | None = None) -> dict:
    """The normalized config with the schema's defaults filled in, or ConfigError naming the first bad field: the one
    validation pass of a start. command_line: the `--config` values (text where nested). Nothing here runs or touches
    a file."""
    refuse_quoted_numbers(config, command_line)
    config = normalized(config)
    refuse_non_finite(config)
    validate(config, None, "config", defaults=True)
    problems = apex_problems(config.get("apex") or {})
    if problems:
        field, problem = problems[0]
        raise ConfigError(f"Config error at config.apex.{field}: {problem}. Fix that value in your config "
                          "(docs/config.md says what a config value may be).")
    return config


def resolve_runs(config: dict, presets_dir: Path, gpus: list[str], probe: str) -> tuple[dict, dict]:
    """Return (runs, choice): the validated run matrix and which preset was used, with the reason. config is what
    validate_config returned."""
    choice = choose_preset(config.get("preset", "auto"), gpus, probe)
    try:
        preset = presets.read(presets_dir, choice["preset"])
    except presets.PresetError as exc:
        raise ConfigError(str(exc)) from None
    runs = deep_merge(preset, config.get("runs") or {})
    validate(runs, "runs_resolved", "runs")
    # A user's runs.precisions narrows the preset: a preset model left with no cell (e.g. the apex shell's O1/O2
    # models under `precisions: [amp_bf16]`) is left out; a model the user wrote with no cell is an error below.
    written = set((config.get("runs") or {}).get("models") or {})
    for model in [m for m, s in runs["models"].items() if m not in written and "precisions" in s
                  and not set(s["precisions"]) & set(runs["precisions"])]:
        del runs["models"][model]
    for model, settings in runs["models"].items():
        check_model_settings(model, settings)
        check_lora(model, settings, runs["precisions"])
        check_batch(model, settings)
        train = deep_merge(runs["train"], settings.get("train", {}))
        if train["warmup_steps"] >= train["steps"]:
            raise ConfigError(
                f"Config error at runs.train.warmup_steps (model {model}): {train['warmup_steps']} warm-up steps "
                f"leave no timed step out of {train['steps']}. Fix: make warmup_steps smaller than steps."
            )
        if train.get("lr_warmup_steps", 0) >= train["steps"]:
            raise ConfigError(
                f"Config error at runs.train.lr_warmup_steps (model {model}): a {train['lr_warmup_steps']}-step "
                f"learning-rate ramp does not end within the {train['steps']} steps. Fix: make lr_warmup_steps "
                "smaller than steps."
            )
        check_remedies(model, settings, train, [c["precision"] for c in cells(runs) if c["model"] == model])
        if not any(cell["model"] == model for cell in cells(runs)):
            raise ConfigError(
                f"Config error at runs.models.{model}.precisions: none of {settings.get('precisions')} is in "
                f"runs.precisions {runs['precisions']}, so the model has no cell. Fix: add one of them to "
                "runs.precisions or change the model's precisions."
            )
    check_largest_batch(runs)
    return runs, choice


def check_remedies(model: str, settings: dict, train: dict, model_precisions: list[str]) -> None:
    """The second article's AMP remedies only where they act: risky_layer_fp32 on a model with a risky layer under a
    torch.autocast precision, grad_scaler_init_scale where every precision of the model has a GradScaler."""
    if settings.get("risky_layer_fp32"):
        arch = archs.get(settings["arch"])
        if not arch.risky_layer and not (arch.naive_norm_eps and "naive_norm_eps" in settings):
            risky = [name for name in archs.names() if archs.get(name).risky_layer]
            raise ConfigError(
                f"Config error at runs.models.{model}.risky_layer_fp32: arch {arch.name} has no risky layer to take "
                f"out of autocast (only {', '.join(risky)}, or an arch with naive_norm_eps set: "
                f"{', '.join(archs.where(naive_norm_eps=True))}). Fix: remove the key.")
        apex = [p for p in model_precisions if precisions.get(p).needs_apex]
        if apex:
            raise ConfigError(
                f"Config error at runs.models.{model}.risky_layer_fp32: precision {apex[0]} casts through apex, which "
                "a disabled torch.autocast region does not stop, so the setting would do nothing there. Fix: give "
                "this model precisions without apex (e.g. precisions: [amp_fp16]).")
    if train.get("grad_scaler_init_scale") is not None:
        unscaled = [p for p in model_precisions if not precisions.get(p).grad_scaler]
        if unscaled:
            raise ConfigError(
                f"Config error at runs.models.{model}.train.grad_scaler_init_scale: precision {unscaled[0]} has no "
                "GradScaler, so the setting would be ignored there. Fix: set it only on a model whose precisions "
                "all use one (precisions: [amp_fp16]), in that model's train: section.")


def check_largest_batch(runs: dict) -> None:
    """runs.largest_batch names models this run has, each a single-GPU model that is not compiled (one process
    tries its batches)."""
    for model in (runs.get("largest_batch") or {}).get("models", []):
        settings = runs["models"].get(model)
        if settings is None:
            raise ConfigError(
                f"Config error at runs.largest_batch.models: {model} is not a model of this run "
                f"({', '.join(sorted(runs['models']))}). Fix: name one of them, or remove it.")
        if settings.get("gpus", 1) > 1 or settings.get("nodes", 1) > 1 or settings.get("compile"):
            raise ConfigError(
                f"Config error at runs.largest_batch.models: {model} is data-parallel or compiled; the search tries "
                "batches in one process, one step each. Fix: name its single-GPU, uncompiled model instead.")


def largest_batch_searches(runs: dict) -> list[dict]:
    """{model, precision, seed} of every search runs.largest_batch asks for: the model's first seed's cells, except the
    compiled precisions (FP8, compiled bf16: one step per try would time the compiler, and the search builds the model
    eagerly)."""
    models = (runs.get("largest_batch") or {}).get("models", [])
    return [c for c in cells(runs) if c["model"] in models and not precisions.get(c["precision"]).compile
            and c["seed"] == runs["models"][c["model"]].get("seeds", runs["seeds"])[0]]


# A baseline's search (strict FP32, TF32) counts this many shares of runs.largest_batch.seconds, any other search one:
# the baseline's answer is the denominator of every ratio and must be exact, and its tries are the slowest (2-3x an
# AMP try on the H200 at 80 GiB: ViT-B/16 FP32 1.9 s at batch 616, apex O1 1.0 s at 936, 2026-12-01).
BASELINE_SEARCH_SHARES = 2
BASELINE_SEARCH_PRECISIONS = ("fp32", "tf32")


def largest_batch_seconds(searches: list[dict], total: float, precision: str) -> float:
    """Seconds of trial steps one search of `precision` may spend: runs.largest_batch.seconds shared by the run's
    searches, a baseline's search counting BASELINE_SEARCH_SHARES."""
    def shares(name: str) -> int:
        return BASELINE_SEARCH_SHARES if name in BASELINE_SEARCH_PRECISIONS else 1

    return round(total * shares(precision) / max(1, sum(shares(c["precision"]) for c in searches)), 2)


def check_batch(model: str, settings: dict) -> None:
    """A batch the data can supply, split evenly over the model's GPUs: throughput counts exactly this batch."""
    batch, gpus, most = settings["batch_size"], settings.get("gpus", 1), largest_batch(settings["data"])
    if most is not None and batch > most:
        raise ConfigError(
            f"Config error at runs.models.{model}.batch_size: {batch} is more than the {most} samples of the "
            f"{settings['data']} training split. Fix: set batch_size to at most {most}."
        )
    if batch % gpus:
        raise ConfigError(
            f"Config error at runs.models.{model}.batch_size: {batch} does not split evenly over gpus: {gpus}. "
            f"Fix: use a multiple of {gpus} (e.g. {batch - batch % gpus or gpus})."
        )


def check_apex_source(apex: dict, required: bool) -> None:
    """A required apex needs a source and its commit; found now, not by the apex job after it cleared apex.json."""
    source = apex.get("source") or {}
    if required and not (source.get("url") or source.get("path") or source.get("tarball")):
        raise ConfigError(
            "Config error at config.apex.source: apex is required here but no source is set (url, path and tarball "
            "are all null). Fix: set apex.source.url with ref and commit (as config/config.yaml does), "
            "apex.source.path, or apex.source.tarball with sha256; or apex.required: false."
        )
    if (source.get("url") or source.get("path")) and not source.get("tarball") and not source.get("commit"):
        raise ConfigError(
            "Config error at config.apex.source.commit: a url or path source needs the commit it must be. "
            "Fix: set apex.source.commit (apex 25.05 is 379937e1719b8190f38f3e666e2a8d32c97e221f)."
        )


def check_model_settings(model: str, settings: dict) -> None:
    """Settings that only mean something for some models: refuse them elsewhere rather than ignore them."""
    if "activation_checkpointing" in settings and not archs.get(settings["arch"]).activation_checkpointing:
        raise ConfigError(
            f"Config error at runs.models.{model}.activation_checkpointing: arch {settings['arch']} has no "
            f"checkpointed blocks (only {', '.join(archs.where(activation_checkpointing=True))}). Fix: remove the key "
            "or use a llama arch."
        )
    if "shape" in settings and not archs.get(settings["arch"]).ladder:
        laddered = archs.with_ladder()
        raise ConfigError(
            f"Config error at runs.models.{model}.shape: arch {settings['arch']} has no LLaMA shapes (only "
            f"{', '.join(laddered)}). Fix: remove the key or use arch: {laddered[0]}."
        )
    check_data_settings(model, settings)
    if "epoch_tokens" in settings and settings["data"] != "synthetic_tokens":
        raise ConfigError(
            f"Config error at runs.models.{model}.epoch_tokens: data {settings['data']} is not counted in tokens. "
            "Fix: remove the key, or use it on a synthetic_tokens model."
        )


# The precisions a LoRA cell trains under, by the frozen base's dtype (amprepro.train.lora): a bf16 base needs bf16
# autocast (its matmuls and the FP32 adapters meet in one dtype); compiled, FP8 and apex cells are not LoRA's. Which
# archs take `lora` at all is the registry's (archs.Arch.lora; ONLY_FOR below).
LORA_PRECISIONS = {"fp32": ("fp32", "tf32", "amp_fp16", "amp_bf16"), "bf16": ("amp_bf16",)}


def check_lora(model: str, settings: dict, runs_precisions: list[str] | None = None) -> None:
    """A `lora` setting only under the precisions its frozen base trains in."""
    if "lora" not in settings:
        return
    base = (settings["lora"] or {}).get("base", "fp32")
    precisions_here = settings.get("precisions") or runs_precisions or []
    wrong = [p for p in precisions_here if p not in LORA_PRECISIONS[base]]
    if wrong:
        raise ConfigError(f"Config error at runs.models.{model}.precisions: a LoRA model with a frozen {base} base "
                          f"trains under {', '.join(LORA_PRECISIONS[base])} only, not {', '.join(wrong)}. Fix: set "
                          f"the model's precisions to [{', '.join(LORA_PRECISIONS[base])}] or fewer"
                          + (", or use lora.base fp32" if base == "bf16" else "") + ".")


# A model setting -> (the data kinds it means something for, or the arch registry's field that says which archs take
# it), and the config field it depends on.
ONLY_FOR = {
    "data_path": (archs.IMAGE_DATA, "data"),
    "download": (("cifar10",), "data"),
    "eval_windows": ((archs.TEXT_DATA,), "data"),
    "naive_norm_eps": ("naive_norm_eps", "arch"),
    "gumbel_tau": ("gumbel_tau", "arch"),
    "lora": ("lora", "arch"),
}


def check_data_settings(model: str, settings: dict) -> None:
    """The real-data kinds (python_stdlib, cifar10, imagefolder) with an arch that reads them, and their settings
    only where they mean something."""
    data, arch = settings["data"], settings["arch"]
    for key, (allowed, field) in ONLY_FOR.items():
        if field == "arch":  # the arch registry's field says which archs take it
            allowed = archs.where(**{allowed: True})
        if key in settings and settings[field] not in allowed:
            raise ConfigError(f"Config error at runs.models.{model}.{key}: {field} {settings[field]} does not use it "
                              f"(only {field} {', '.join(allowed)}). Fix: remove the key.")
    # The language models that read byte-level text (python_stdlib): byte values are token ids below every vocabulary
    # (256 and up), so a LLaMA shape reads them unchanged (the fp8 preset's 7B shape on real text).
    if data == archs.TEXT_DATA and arch not in archs.reading(data):
        raise ConfigError(f"Config error at runs.models.{model}.arch: data python_stdlib is byte-level text for a "
                          f"language model; arch {arch} is not one. Fix: use arch gpt_bytes (or "
                          f"{', '.join(archs.reading(data))}).")
    if data in archs.IMAGE_DATA:
        if arch not in archs.reading(data):
            raise ConfigError(f"Config error at runs.models.{model}.arch: data {data} needs an arch that reads "
                              f"3-channel images of any size ({', '.join(archs.reading(data))}). Fix: use one of "
                              "them.")
        if not settings.get("data_path"):
            raise ConfigError(f"Config error at runs.models.{model}.data_path: data {data} needs the dataset's "
                              "directory. Fix: set data_path (docs: amprepro.train.imagedata).")


def cells(runs: dict) -> list[dict]:
    """Every cell of models x precisions x seeds, in a stable order."""
    return [
        {"model": model, "precision": precision, "seed": seed}
        for model, settings in runs["models"].items()
        for precision in runs["precisions"]
        if precision in settings.get("precisions", runs["precisions"])
        for seed in settings.get("seeds", runs["seeds"])
    ]


def cell_spec(runs: dict, model: str, precision: str, seed: int) -> CellSpec:
    """Everything a single run needs: the settings of this cell only, so other cells' edits don't rerun it. Built
    once here, at DAG build time; every later stage reads this record (amprepro.cellspec). cell_spec_dict and
    cell_spec_json are its JSON forms."""
    settings = runs["models"][model]
    return CellSpec(model=model, precision=precision, seed=int(seed),
                    model_config={k: v for k, v in settings.items() if k not in ("precisions", "seeds", "train")},
                    train=deep_merge(runs["train"], settings.get("train", {})))


def cell_spec_dict(runs: dict, model: str, precision: str, seed: int) -> dict:
    return cell_spec(runs, model, precision, seed).as_dict()


def cell_spec_json(runs: dict, model: str, precision: str, seed: int) -> str:
    return cell_spec(runs, model, precision, seed).to_json()


def plan_cells(runs: dict, config: dict) -> list[dict]:
    """What the memory plan decides over: every cell's spec, and whether its model's batch is the preset's (an upper
    bound the plan may lower) or written in the user's config (kept as written)."""
    written = {name for name, settings in ((config.get("runs") or {}).get("models") or {}).items()
               if isinstance(settings, dict) and "batch_size" in settings}
    return [{"spec": cell_spec_dict(runs, c["model"], c["precision"], c["seed"]),
             "batch_source": "config" if c["model"] in written else "preset"} for c in cells(runs)]


def gpu_memory_limit(config: dict) -> float | None:
    """gpu_memory_limit_gib as a number (a `--config` value arrives as text), or None."""
    value = config.get("gpu_memory_limit_gib")
    return None if value in (None, "null", "") else float(value)


def apex_required(setting, gpus: list[str]) -> bool:
    if setting == "auto":
        return bool(gpus)
    return bool(setting)


def checked(files: list[str], probe=visible_gpus) -> str:
    """What `snakemake --configfile FILES` would run, found without running anything; ConfigError otherwise."""
    config = read_config_file(REPO / "config" / "config.yaml")
    for path in files:
        config = deep_merge(config, read_config_file(path))
    config = validate_config(config)
    gpus, why = gpus_for_jobs(config.get("gpu", "auto"), probe)
    runs, choice = resolve_runs(config, REPO / "config" / "presets", gpus, why)
    check_apex_source(config["apex"], apex_required(config["apex"]["required"], gpus))
    return f"{', '.join(map(str, files))}: OK. {choice['reason']}; {len(cells(runs))} cells."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amprepro.config", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="read and validate config files; nothing in them is run")
    checking.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    try:
        print(checked(args.files))
    except ConfigError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
