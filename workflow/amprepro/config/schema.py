"""The config against its schema: what YAML users write made what they meant, the schema's defaults filled in, the first
bad field named (with the closest known key where one is unknown): the one validation pass of a start."""

from __future__ import annotations

import copy
import difflib
import functools
import math
import re
from pathlib import Path

import jsonschema
import yaml

from amprepro import archs, precisions
from amprepro.config.errors import ConfigError
from amprepro.safevalues import apex_problems, shorten
from amprepro.schemaerrors import bounded_message, field_name, first_error

REPO = Path(__file__).resolve().parents[3]
SCHEMA_PATH = REPO / "workflow" / "schemas" / "config.schema.yaml"
MAX_NODES = 100_000  # values in a config; YAML aliases can expand a small file into a huge structure
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\Z")


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
