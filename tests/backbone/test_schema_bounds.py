"""Every numeric bound of workflow/schemas/config.schema.yaml (minimum, maximum, exclusiveMinimum, minLength,
maxLength, minItems, minProperties), each tried with a value just inside and just outside it, in each spelling a
value can have: unquoted in a config file, quoted in a config file, and as `--config` text (Snakemake passes nested
`--config` values as text). The bounds are written out here by hand, not read from the schema, so that a changed
bound fails these tests; the inventory test fails when the schema gains a bound this table does not have.

tools/mutation/schema_bounds.py mutates each bound (one more, one less, inclusive made exclusive or the reverse,
removed) and runs the tests here other than the inventory against each mutant (docs/mutation.md).
"""

from __future__ import annotations

import pytest
import yaml

from amprepro import config as cfg
from amprepro.config.schema import SCHEMA_PATH as schema_path

KEYWORDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
            "maxItems", "minProperties", "maxProperties", "multipleOf"}

M = ("runs", "models", "m")  # a model's fields: runs.models.<name>
T = ("runs", "train")  # $defs/train, through runs.train
SEED_MAX = 4294967295

# (where in the schema, keyword, bound, the field in a config, its type, a value just inside, one just outside)
BOUNDS = [
    ("properties/apex/properties/build_jobs", "minimum", 1, ("apex", "build_jobs"), "integer", 1, 0),
    ("properties/report/properties/title", "maxLength", 200, ("report", "title"), "string", "t" * 200, "t" * 201),
    ("properties/gpu_memory_limit_gib", "exclusiveMinimum", 0, ("gpu_memory_limit_gib",), "number", 0.001, 0),
    ("properties/resources/properties/runtime_factor", "exclusiveMinimum", 0, ("resources", "runtime_factor"),
     "number", 0.001, 0),
    ("$defs/model/properties/data_path", "minLength", 1, (*M, "data_path"), "string", "d", ""),
    ("$defs/model/properties/data_path", "maxLength", 4096, (*M, "data_path"), "string", "d" * 4096, "d" * 4097),
    ("$defs/model/properties/eval_every", "minimum", 1, (*M, "eval_every"), "integer", 1, 0),
    ("$defs/model/properties/eval_windows", "minimum", 1, (*M, "eval_windows"), "integer", 1, 0),
    ("$defs/model/properties/eval_windows", "maximum", 4096, (*M, "eval_windows"), "integer", 4096, 4097),
    ("$defs/model/properties/naive_norm_eps", "exclusiveMinimum", 0, (*M, "naive_norm_eps"), "number", 0.001, 0),
    ("$defs/model/properties/gumbel_tau", "exclusiveMinimum", 0, (*M, "gumbel_tau"), "number", 0.001, 0),
    ("$defs/model/properties/gumbel_tau", "maximum", 1000000, (*M, "gumbel_tau"), "number", 1000000, 1000000.5),
    ("$defs/model/properties/batch_size", "minimum", 1, (*M, "batch_size"), "integer", 1, 0),
    ("$defs/model/properties/image_size", "minimum", 8, (*M, "image_size"), "integer", 8, 7),
    ("$defs/model/properties/seq_len", "minimum", 2, (*M, "seq_len"), "integer", 2, 1),
    ("$defs/model/properties/gpus", "minimum", 1, (*M, "gpus"), "integer", 1, 0),
    ("$defs/model/properties/nodes", "minimum", 1, (*M, "nodes"), "integer", 1, 0),
    ("$defs/model/properties/lora/properties/rank", "minimum", 1, (*M, "lora", "rank"), "integer", 1, 0),
    ("$defs/model/properties/lora/properties/rank", "maximum", 1024, (*M, "lora", "rank"), "integer", 1024, 1025),
    ("$defs/model/properties/lora/properties/alpha", "exclusiveMinimum", 0, (*M, "lora", "alpha"), "number", 0.001,
     0),
    ("$defs/model/properties/lora/properties/targets", "minItems", 1, (*M, "lora", "targets"), "array", ["qkv"], []),
    ("$defs/model/properties/epoch_tokens", "minimum", 1, (*M, "epoch_tokens"), "integer", 1, 0),
    ("$defs/model/properties/precisions", "minItems", 1, (*M, "precisions"), "array", ["fp32"], []),
    ("$defs/model/properties/seeds", "minItems", 1, (*M, "seeds"), "array", [0], []),
    ("$defs/model/properties/seeds/items", "minimum", 0, (*M, "seeds", 0), "integer", 0, -1),
    ("$defs/model/properties/seeds/items", "maximum", SEED_MAX, (*M, "seeds", 0), "integer", SEED_MAX, SEED_MAX + 1),
    ("$defs/train/properties/steps", "minimum", 1, (*T, "steps"), "integer", 1, 0),
    ("$defs/train/properties/warmup_steps", "minimum", 0, (*T, "warmup_steps"), "integer", 0, -1),
    ("$defs/train/properties/lr", "exclusiveMinimum", 0, (*T, "lr"), "number", 0.001, 0),
    ("$defs/train/properties/weight_decay", "minimum", 0, (*T, "weight_decay"), "number", 0, -0.001),
    ("$defs/train/properties/grad_scaler_init_scale", "exclusiveMinimum", 0, (*T, "grad_scaler_init_scale"),
     "number", 0.001, 0),
    ("$defs/train/properties/grad_scaler_init_scale", "maximum", 16777216, (*T, "grad_scaler_init_scale"), "number",
     16777216, 16777216.5),
    ("$defs/train/properties/lr_warmup_steps", "minimum", 0, (*T, "lr_warmup_steps"), "integer", 0, -1),
    ("$defs/runs/properties/precisions", "minItems", 1, ("runs", "precisions"), "array", ["fp32"], []),
    ("$defs/runs/properties/seeds", "minItems", 1, ("runs", "seeds"), "array", [0], []),
    ("$defs/runs/properties/seeds/items", "minimum", 0, ("runs", "seeds", 0), "integer", 0, -1),
    ("$defs/runs/properties/seeds/items", "maximum", SEED_MAX, ("runs", "seeds", 0), "integer", SEED_MAX,
     SEED_MAX + 1),
    ("$defs/runs/properties/largest_batch/properties/up_to", "minimum", 2, ("runs", "largest_batch", "up_to"),
     "integer", 2, 1),
    ("$defs/runs/properties/largest_batch/properties/up_to", "maximum", 64, ("runs", "largest_batch", "up_to"),
     "integer", 64, 65),
    ("$defs/runs/properties/largest_batch/properties/seconds", "exclusiveMinimum", 0,
     ("runs", "largest_batch", "seconds"), "number", 0.001, 0),
    ("$defs/runs_resolved/allOf/1/properties/models", "minProperties", 1, None, "object",
     {"m": {"arch": "small_cnn", "data": "digits", "batch_size": 1}}, {}),
]
IDS = [f"{where}:{keyword}" for where, keyword, *_ in BOUNDS]
# What jsonschema says of a value outside each kind of bound (the bound itself where it says it).
REFUSED = {"minimum": "is less than the minimum of {}",
           "exclusiveMinimum": "is less than or equal to the minimum of {}",
           "maximum": "is greater than the maximum of {}", "maxLength": "is too long",
           "minLength": "should be non-empty", "minItems": "should be non-empty",
           "minProperties": "should be non-empty"}


def test_inventory_every_numeric_bound_of_the_schema_is_in_the_table():
    """The raw YAML (as written, before load_schema fills in the enums): each numeric keyword, where it is."""
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in KEYWORDS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    found.append((where, key, value))
                else:
                    walk(value, f"{where}/{key}" if where else str(key))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}/{i}")

    walk(yaml.safe_load(schema_path.read_text()), "")
    assert sorted(found) == sorted((where, keyword, bound) for where, keyword, bound, *_ in BOUNDS)


def nested(field: tuple, value) -> dict:
    """{"runs": {"models": {"m": {"seeds": [value]}}}} for ("runs", "models", "m", "seeds", 0)."""
    for key in reversed(field):
        value = [value] if key == 0 else {key: value}
    return value


def dotted(field: tuple) -> str:
    return "config" + "".join(f"[{key}]" if key == 0 else f".{key}" for key in field)


def from_file(tmp_path, config: dict) -> dict:
    """The config as a config file holds it: written as YAML (text quoted), read back by the pipeline's reader."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return cfg.read_config_file(path)


def value_at(config: dict, field: tuple):
    for key in field:
        config = config[key]
    return config


def refusal(field, keyword, bound, value) -> str:
    """The message's start; of a value too long to show, only its field (schemaerrors.bounded_message cuts it)."""
    message = f"Config error at {dotted(field)}: {value!r} {REFUSED[keyword].format(bound)}. Fix that value"
    return message if len(message) < 200 else f"Config error at {dotted(field)}: {value!r}"[:100]


def spellings(bound):
    """(how the value is written, the config-file value or --config text) for each spelling of a scalar bound."""
    return [("unquoted", bound), ("quoted", str(bound)), ("--config", str(bound))]


def check(tmp_path, field, spelling, written):
    config = from_file(tmp_path, nested(field, written))
    return cfg.validate_config(config, command_line=config if spelling == "--config" else None)


@pytest.mark.parametrize(("where", "keyword", "bound", "field", "kind", "inside", "outside"),
                         [b for b in BOUNDS if b[4] in ("integer", "number")],
                         ids=[i for i, b in zip(IDS, BOUNDS) if b[4] in ("integer", "number")])
@pytest.mark.parametrize("spelling", ["unquoted", "quoted", "--config"])
def test_a_number_just_inside_its_bound_passes_and_one_just_outside_is_refused(
        tmp_path, where, keyword, bound, field, kind, inside, outside, spelling):
    written_inside, written_outside = ((inside, outside) if spelling == "unquoted" else (str(inside), str(outside)))
    if spelling == "quoted" and kind == "integer":
        # an integer field refuses any quoted value, in range or not: it is text (refuse_quoted_numbers)
        for value, text in ((inside, written_inside), (outside, written_outside)):
            with pytest.raises(cfg.ConfigError) as error:
                check(tmp_path, field, spelling, text)
            assert str(error.value) == (f"Config error at {dotted(field)}: {text!r} is text (it is quoted in the "
                                        f"file), where an integer is wanted. Fix: write {value} without quotes.")
        return
    accepted = value_at(check(tmp_path, field, spelling, written_inside), field)
    assert accepted == inside and not isinstance(accepted, str)
    with pytest.raises(cfg.ConfigError) as error:
        check(tmp_path, field, spelling, written_outside)
    assert str(error.value).startswith(refusal(field, keyword, bound, outside))


@pytest.mark.parametrize(("where", "keyword", "bound", "field", "kind", "inside", "outside"),
                         [b for b in BOUNDS if b[4] in ("string", "array")],
                         ids=[i for i, b in zip(IDS, BOUNDS) if b[4] in ("string", "array")])
@pytest.mark.parametrize("spelling", ["file", "--config"])
def test_a_text_or_list_just_inside_its_length_bound_passes_and_one_just_outside_is_refused(
        tmp_path, where, keyword, bound, field, kind, inside, outside, spelling):
    """Texts and lists have one spelling each (a quoted text is the text); a --config value is the same value."""
    assert len(inside) == bound and len(outside) == bound + (1 if keyword.startswith("max") else -1)
    assert value_at(check(tmp_path, field, spelling, inside), field) == inside
    with pytest.raises(cfg.ConfigError) as error:
        check(tmp_path, field, spelling, outside)
    assert str(error.value).startswith(refusal(field, keyword, bound, outside))


def test_a_resolved_run_matrix_needs_at_least_one_model():
    [(_, keyword, bound, _, _, inside, outside)] = [b for b in BOUNDS if b[4] == "object"]
    runs = {"precisions": ["fp32"], "seeds": [0], "train": {"steps": 2, "warmup_steps": 1, "lr": 0.1,
                                                             "optimizer": "sgd"}}
    assert len(inside) == bound
    cfg.validate({**runs, "models": inside}, "runs_resolved", "runs")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.validate({**runs, "models": outside}, "runs_resolved", "runs")
    assert str(error.value).startswith(f"Config error at runs.models: {{}} {REFUSED[keyword]}. Fix that value")
