"""amprepro.config's checks in this process, each message in full (the whole text a user fixing a config reads): the
file reader, the YAML messages, the size limit, coercion of text and floats, unknown keys, quoted numbers, the run
matrix's checks (batch, apex source, model and data settings, the largest-batch searches), the cells and specs, and
`python -m amprepro.config check` through its main(). No Snakemake, no torch: each test takes milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from amprepro import config as cfg
from amprepro.config import cli, reading, schema

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "config" / "presets"
BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(cfg.ConfigError) as error:
        call(*args, **kwargs)
    return str(error.value)


def smoke_runs(**runs_overrides):
    config = cfg.validate_config(cfg.deep_merge(BASE, {"preset": "smoke", "runs": runs_overrides}))
    return cfg.resolve_runs(config, PRESETS, [], "no nvidia-smi on PATH")[0]


# --- choosing the preset and the GPUs ---

def test_the_gpu_setting_and_the_preset_choice_say_why():
    def probe():
        return ["NVIDIA H200"], "nvidia-smi lists 1 GPU(s)"

    for setting in (True, "true"):
        assert cfg.gpus_for_jobs(setting, probe) == (
            ["configured GPU"], "the config says the jobs run on GPU nodes (gpu: true)")
    for setting in (False, "false"):
        assert cfg.gpus_for_jobs(setting, probe) == ([], "the config says the jobs run without a GPU (gpu: false)")
    assert cfg.gpus_for_jobs("auto", probe) == probe()
    assert cfg.choose_preset("auto", ["g"], "nvidia-smi lists 1 GPU(s)") == {
        "preset": "paper", "reason": "preset: auto chose paper because nvidia-smi lists 1 GPU(s)"}
    assert cfg.choose_preset("auto", [], "no nvidia-smi on PATH") == {
        "preset": "smoke", "reason": "preset: auto chose smoke because no nvidia-smi on PATH"}
    assert cfg.choose_preset("fp8", ["g"], "x") == {"preset": "fp8", "reason": "preset: fp8 set in the config"}
    assert cfg.apex_required("auto", ["g"]) is True and cfg.apex_required("auto", []) is False
    assert cfg.apex_required(True, []) is True and cfg.apex_required(False, ["g"]) is False


def test_deep_merge_merges_key_by_key_and_copies():
    base = {"a": {"x": 1, "y": {"z": 2}}, "b": [1], "c": 3}
    override = {"a": {"y": {"w": 4}}, "b": [2], "d": {"e": 5}, "c": {"f": 6}}
    merged = cfg.deep_merge(base, override)
    assert merged == {"a": {"x": 1, "y": {"z": 2, "w": 4}}, "b": [2], "c": {"f": 6}, "d": {"e": 5}}
    merged["a"]["y"]["z"] = 99
    merged["d"]["e"] = 99
    assert base["a"]["y"]["z"] == 2 and override["d"]["e"] == 5  # neither input changed
    assert cfg.deep_merge(base, None) == base and cfg.deep_merge(base, None) is not base


# --- reading a file ---

def test_a_file_that_cannot_be_read_or_is_not_utf8(tmp_path):
    missing = tmp_path / "none.yaml"
    assert refused(cfg.read_config_file, missing) == (
        f"{missing}: cannot be read (No such file or directory). Fix: check the path and its permissions.")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"preset: smoke\nreport:\n  title: caf\xe9\n")
    assert refused(cfg.read_config_file, latin) == (
        f"{latin}, line 3, column 13: byte 0xe9 is not UTF-8. Fix: save the file as UTF-8.")
    first = tmp_path / "first.yaml"
    first.write_bytes(b"\xff")
    assert refused(cfg.read_config_file, first) == f"{first}, line 1, column 1: byte 0xff is not UTF-8. Fix: save " \
                                                   "the file as UTF-8."


def test_a_file_must_hold_plain_keys_and_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("")
    assert cfg.read_config_file(path) == {}
    path.write_text("preset: smoke\nruns: {seeds: [1]}\n")
    assert cfg.read_config_file(str(path)) == {"preset": "smoke", "runs": {"seeds": [1]}}
    path.write_text("- preset\n")
    assert refused(cfg.read_config_file, path) == (
        f"{path}: holds a list, not keys and values. Fix: write it as `key: value` lines (preset:, runs:, apex:, "
        "...), as config/config.yaml does.")
    path.write_text("__use_yte__: true\npreset: smoke\n")
    assert refused(cfg.read_config_file, path) == (
        f"{path}: sets __use_yte__, which makes Snakemake evaluate the file as a template with Python expressions. "
        "Fix: remove __use_yte__ and write plain values (docs/config.md).")


@pytest.mark.parametrize("text, message", [
    ('a: 1\nb: "abc\nc: 1\n', "line 2, column 4: not valid YAML (a quoted value starts here and is not closed; the "
     "reader stopped at line 4: 'found unexpected end of stream'). Fix: add its closing quote on that line, or quote "
     "the value."),
    ("a: [1,\nb: 2\n", "line 1, column 4: not valid YAML (a [ list starts here and is not closed; the reader stopped "
     "at line 3: \"expected ',' or ']', but got '<stream end>'\"). Fix: add its ] on that line, or quote the value."),
    ("a: {x: 1,\nb: 2\n", "line 1, column 4: not valid YAML (a { mapping starts here and is not closed; the reader "
     "stopped at line 3: \"expected ',' or '}', but got '<stream end>'\"). Fix: add its } on that line, or quote the "
     "value."),
    ("a:\n\tb: 1\n", "line 2, column 1: not valid YAML (\"found character '\\\\t' that cannot start any token\"). "
     "Fix: indent with spaces; YAML does not allow tabs there."),
    ("a: b: c\n", "line 1, column 5: not valid YAML ('mapping values are not allowed here'). Fix: check the "
     "indentation, brackets and quotes on that line or the one before (a value with ': ' or ' #' needs quotes)."),
])
def test_a_yaml_error_names_the_line_to_fix(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert refused(cfg.read_config_file, path) == f"{path}, {message}"


def test_a_yaml_error_without_a_position_names_the_file():
    error = yaml.YAMLError("something odd\nsecond line")
    assert reading._yaml_message(Path("c.yaml"), error) == (
        "c.yaml: not valid YAML ('something odd'). Fix: check the indentation, brackets and quotes on that line or "
        "the one before (a value with ': ' or ' #' needs quotes).")
    unclosed = yaml.MarkedYAMLError(context="while scanning a quoted scalar",
                                    context_mark=yaml.Mark("c", 0, 4, 6, None, None), problem="found end")
    assert reading._yaml_message(Path("c.yaml"), unclosed) == (
        "c.yaml, line 5, column 7: not valid YAML (a quoted value starts here and is not closed; the reader stopped "
        "at the end: 'found end'). Fix: add its closing quote on that line, or quote the value.")


def test_a_config_of_more_values_than_a_real_one_is_refused():
    assert schema.MAX_NODES == 100_000
    schema._check_size({"a": [0] * 99_998})  # the dict, the list and its items: exactly MAX_NODES values
    assert refused(schema._check_size, {"a": [0] * 99_999}) == (
        "Config error at config: more than 100000 values (YAML aliases that expand?). Fix: write the config out "
        "plainly; a real one has a few hundred.")
    assert refused(schema._check_size, {"a": {str(i): i for i in range(99_999)}}).startswith(
        "Config error at config: more than 100000 values")


# --- coercion ---

@pytest.mark.parametrize("text, value", [
    ("-8", -8), ("1e-3", 0.001), ("1.2e2", 120.0), (".5", 0.5), ("+3.", 3.0), ("true", True), ("null", None),
    ("abc", "abc"), ("[1, 2]", "[1, 2]"), ("{a: 1}", "{a: 1}"), ("a: [", "a: ["), ("1e", "1e"),
])
def test_a_text_is_read_as_the_yaml_scalar_it_is(text, value):
    parsed = schema._scalar(text)
    assert parsed == value and type(parsed) is type(value)


def test_normalized_makes_text_and_floats_what_the_schema_asks_for():
    config = cfg.normalized({"runs": {"seeds": ["2", 3.0], "train": {"steps": "40", "lr": "1e-3", "optimizer": "sgd"},
                                      "models": {"cnn": {"batch_size": "-8", "arch": "small_cnn"}}},
                             "apex": None, "gpu_memory_limit_gib": "24", "report": {"title": "1.5"}})
    assert config["runs"]["seeds"] == [2, 3] and all(type(s) is int for s in config["runs"]["seeds"])
    assert config["runs"]["train"] == {"steps": 40, "lr": 0.001, "optimizer": "sgd"}
    assert type(config["runs"]["train"]["steps"]) is int
    assert config["runs"]["models"]["cnn"] == {"batch_size": -8, "arch": "small_cnn"}  # the range is checked later
    assert config["apex"] == {}  # an empty section
    assert config["report"]["title"] == "1.5"  # a string field keeps its text
    assert cfg.normalized({"runs": {"train": {"lr": 2.0}}})["runs"]["train"]["lr"] == 2.0  # a number stays a float
    assert type(cfg.normalized({"runs": {"train": {"steps": 2.0}}})["runs"]["train"]["steps"]) is int


# --- validation messages ---

def test_an_unknown_key_gets_the_closest_known_one_or_the_allowed_keys():
    message = refused(cfg.validate_config, {"runz": {}})
    assert message.startswith("Config error at config: unknown key 'runz'. Did you mean `runs`? Fix: rename it to "
                              "runs (the keys allowed in config: preset, gpu, ")
    assert message.endswith(").")
    message = refused(cfg.validate_config, {"colour": "red"})
    assert message.startswith("Config error at config: unknown key 'colour'. Fix: remove it, or use one of the keys "
                              "allowed in config: preset, gpu, ")
    assert message.endswith(" (config.schema.yaml).")


def test_a_bad_value_names_its_field_and_the_schema():
    assert refused(cfg.validate_config, {"runs": {"train": {"lr": -1}}}) == (
        "Config error at config.runs.train.lr: -1 is less than or equal to the minimum of 0. Fix that value in your "
        "config (allowed values are in config.schema.yaml).")
    assert refused(cfg.validate, {"models": {}}, "runs_resolved", "runs").startswith("Config error at runs")


def test_a_quoted_number_or_boolean_in_a_file_is_text():
    assert refused(cfg.validate_config, {"runs": {"seeds": ["0"]}}) == (
        "Config error at config.runs.seeds[0]: '0' is text (it is quoted in the file), where an integer is wanted. "
        "Fix: write 0 without quotes.")
    assert refused(cfg.validate_config, {"runs": {"train": {"deterministic": "true"}}}) == (
        "Config error at config.runs.train.deterministic: 'true' is text (it is quoted in the file), where true/false "
        "is wanted. Fix: write true without quotes.")
    # from the command line, where every nested value is text: accepted, key by key
    given = {"runs": {"train": {"steps": "50"}}}
    config = cfg.validate_config({"runs": {"train": {"steps": "50", "warmup_steps": "5"}, "seeds": ["1"]}},
                                 command_line={"runs": {"train": {"steps": "50", "warmup_steps": "5"},
                                                        "seeds": ["1"]}})
    assert config["runs"]["train"]["steps"] == 50 and config["runs"]["seeds"] == [1]
    assert refused(cfg.validate_config, {"runs": {"train": {"steps": "50", "warmup_steps": "5"}}},
                   command_line=given).startswith("Config error at config.runs.train.warmup_steps: '5' is text")
    assert cfg.validate_config({"preset": "smoke"}, command_line={"preset": "smoke"})["preset"] == "smoke"


def test_an_apex_value_that_would_reach_git_is_refused():
    assert refused(cfg.validate_config, {"apex": {"source": {"ref": "--upload-pack=x"}}}).startswith(
        "Config error at config.apex.source.ref: '--upload-pack=x' ")
    assert refused(cfg.validate_config, {"apex": {"source": {"ref": "--upload-pack=x"}}}).endswith(
        ". Fix that value in your config (docs/config.md says what a config value may be).")


def test_validation_fills_in_the_schemas_defaults():
    config = cfg.validate_config({})
    assert config["preset"] == "auto" and config["gpu"] == "auto" and config["runs"] == {}
    assert config["apex"]["required"] == "auto"


# --- the run matrix ---

def test_the_smoke_matrix_and_its_cells():
    runs = smoke_runs(seeds=[0, 1])
    cells = cfg.cells(runs)
    assert len(cells) == 2 * 6 * 2 and cells[:3] == [{"model": "cnn", "precision": "fp32", "seed": 0},
                                                     {"model": "cnn", "precision": "fp32", "seed": 1},
                                                     {"model": "cnn", "precision": "tf32", "seed": 0}]
    runs = smoke_runs(models={"cnn": {"precisions": ["fp32", "amp_bf16"], "seeds": [7]}})
    assert [c for c in cfg.cells(runs) if c["model"] == "cnn"] == [
        {"model": "cnn", "precision": "fp32", "seed": 7}, {"model": "cnn", "precision": "amp_bf16", "seed": 7}]


def test_a_cell_spec_holds_its_model_and_its_merged_train_settings():
    runs = smoke_runs(models={"cnn": {"train": {"steps": 20}, "precisions": ["fp32"], "seeds": [3]}})
    spec = cfg.cell_spec_dict(runs, "cnn", "fp32", "3")
    assert spec["model"] == "cnn" and spec["precision"] == "fp32" and spec["seed"] == 3
    assert spec["model_config"] == {"arch": "small_cnn", "data": "digits", "batch_size": 64}
    assert spec["train"] == {**runs["train"], "steps": 20} and runs["train"]["steps"] == 40
    assert cfg.cell_spec_json(runs, "cnn", "fp32", 3) == cfg.cell_spec(runs, "cnn", "fp32", 3).to_json()


def test_the_plan_knows_which_batches_the_user_wrote():
    runs = smoke_runs()
    written = {"runs": {"models": {"cnn": {"batch_size": 64}, "transformer": {"seeds": [0]}, "other": None}}}
    plan = cfg.plan_cells(runs, written)
    assert {(p["spec"]["model"], p["batch_source"]) for p in plan} == {("cnn", "config"), ("transformer", "preset")}
    assert len(plan) == len(cfg.cells(runs)) and plan[0]["spec"] == cfg.cell_spec_dict(runs, "cnn", "fp32", 0)
    assert {p["batch_source"] for p in cfg.plan_cells(runs, {"runs": None})} == {"preset"}


def test_the_memory_limit_is_a_number_or_none():
    assert cfg.gpu_memory_limit({"gpu_memory_limit_gib": "24"}) == 24.0
    assert cfg.gpu_memory_limit({"gpu_memory_limit_gib": 40}) == 40.0
    for value in (None, "null", ""):
        assert cfg.gpu_memory_limit({"gpu_memory_limit_gib": value}) is None
    assert cfg.gpu_memory_limit({}) is None


def test_a_missing_preset_file_and_a_model_without_cells(tmp_path):
    config = cfg.validate_config(cfg.deep_merge(BASE, {"preset": "smoke"}))
    assert refused(cfg.resolve_runs, config, tmp_path, [], "x") == (
        f"Preset file {tmp_path / 'smoke.yaml'} is missing. Fix: restore it from the repository.")
    config = cfg.validate_config(cfg.deep_merge(BASE, {"preset": "smoke", "runs": {
        "precisions": ["fp32"], "models": {"cnn": {"precisions": ["amp_bf16"]}}}}))
    assert refused(cfg.resolve_runs, config, PRESETS, [], "x") == (
        "Config error at runs.models.cnn.precisions: none of ['amp_bf16'] is in runs.precisions ['fp32'], so the model "
        "has no cell. Fix: add one of them to runs.precisions or change the model's precisions.")
    runs, choice = cfg.resolve_runs(cfg.validate_config(cfg.deep_merge(BASE, {"preset": "auto"})), PRESETS, ["g"],
                                    "nvidia-smi lists 1 GPU(s)")
    assert choice["preset"] == "paper" and "vit_b_16" in runs["models"]


def test_a_batch_the_data_cannot_supply_or_the_gpus_cannot_split():
    assert refused(cfg.check_batch, "cnn", {"batch_size": 1439, "data": "digits"}) == (
        "Config error at runs.models.cnn.batch_size: 1439 is more than the 1438 samples of the digits training split. "
        "Fix: set batch_size to at most 1438.")
    cfg.check_batch("cnn", {"batch_size": 1438, "data": "digits"})
    cfg.check_batch("cnn", {"batch_size": 100_000, "data": "synthetic_images", "gpus": 4})
    assert refused(cfg.check_batch, "vit", {"batch_size": 10, "data": "synthetic_images", "gpus": 4}) == (
        "Config error at runs.models.vit.batch_size: 10 does not split evenly over gpus: 4. Fix: use a multiple of 4 "
        "(e.g. 8).")
    assert refused(cfg.check_batch, "vit", {"batch_size": 3, "data": "synthetic_images", "gpus": 4}).endswith(
        "Fix: use a multiple of 4 (e.g. 4).")


def test_the_warmup_is_checked_against_the_models_own_steps():
    message = refused(smoke_runs, models={"transformer": {"train": {"steps": 30, "warmup_steps": 30}}})
    assert message == ("Config error at runs.train.warmup_steps (model transformer): 30 warm-up steps leave no timed "
                       "step out of 30. Fix: make warmup_steps smaller than steps.")
    assert smoke_runs(models={"transformer": {"train": {"steps": 31, "warmup_steps": 30}}})["models"]["transformer"]


def test_an_apex_source_must_be_set_and_pinned():
    none = {"url": None, "path": None, "tarball": None}
    assert refused(cfg.check_apex_source, {"source": none}, True) == (
        "Config error at config.apex.source: apex is required here but no source is set (url, path and tarball are "
        "all null). Fix: set apex.source.url with ref and commit (as config/config.yaml does), apex.source.path, or "
        "apex.source.tarball with sha256; or apex.required: false.")
    cfg.check_apex_source({"source": none}, False)
    cfg.check_apex_source({}, False)
    for source in ({"url": "https://x/apex.git"}, {"path": "/src/apex"}):
        assert refused(cfg.check_apex_source, {"source": source}, False) == (
            "Config error at config.apex.source.commit: a url or path source needs the commit it must be. Fix: set "
            "apex.source.commit (apex 25.05 is 379937e1719b8190f38f3e666e2a8d32c97e221f).")
        cfg.check_apex_source({"source": {**source, "commit": "379937e1"}}, True)
    cfg.check_apex_source({"source": {"path": "/src/apex", "tarball": "/a.tar.gz"}}, True)
    cfg.check_apex_source({"source": {"tarball": "/a.tar.gz"}}, True)


@pytest.mark.parametrize("settings, message", [
    ({"arch": "small_cnn", "data": "digits", "activation_checkpointing": True},
     "Config error at runs.models.m.activation_checkpointing: arch small_cnn has no checkpointed blocks (only llama, "
     "llama_tiny). Fix: remove the key or use a llama arch."),
    ({"arch": "llama_tiny", "data": "synthetic_tokens", "shape": "7b"},
     "Config error at runs.models.m.shape: arch llama_tiny has no LLaMA shapes (only llama). Fix: remove the key or "
     "use arch: llama."),
    ({"arch": "small_cnn", "data": "digits", "epoch_tokens": 10},
     "Config error at runs.models.m.epoch_tokens: data digits is not counted in tokens. Fix: remove the key, or use "
     "it on a synthetic_tokens model."),
    ({"arch": "small_cnn", "data": "digits", "data_path": "/d"},
     "Config error at runs.models.m.data_path: data digits does not use it (only data cifar10, imagefolder). Fix: "
     "remove the key."),
    ({"arch": "resnet50", "data": "imagefolder", "data_path": "/d", "download": True},
     "Config error at runs.models.m.download: data imagefolder does not use it (only data cifar10). Fix: remove the "
     "key."),
    ({"arch": "small_cnn", "data": "digits", "naive_norm_eps": 1e-5},
     "Config error at runs.models.m.naive_norm_eps: arch small_cnn does not use it (only arch gpt, gpt_tiny, "
     "gpt_bytes). Fix: remove the key."),
    ({"arch": "tiny_transformer", "data": "python_stdlib"},
     "Config error at runs.models.m.arch: data python_stdlib is byte-level text for a language model; arch "
     "tiny_transformer is not one. Fix: use arch gpt_bytes (or gpt, gpt_tiny, gpt_bytes, llama, llama_tiny, "
     "lstm_bytes, gumbel_bytes)."),
    ({"arch": "vit_b_16", "data": "cifar10", "data_path": "/d"},
     "Config error at runs.models.m.arch: data cifar10 needs an arch that reads 3-channel images of any size "
     "(small_cnn, resnet50). Fix: use one of them."),
    ({"arch": "resnet50", "data": "imagefolder"},
     "Config error at runs.models.m.data_path: data imagefolder needs the dataset's directory. Fix: set data_path "
     "(docs: amprepro.train.imagedata)."),
])
def test_a_model_setting_where_it_means_nothing_is_refused(settings, message):
    assert refused(cfg.check_model_settings, "m", settings) == message


@pytest.mark.parametrize("settings", [
    {"arch": "llama", "data": "synthetic_tokens", "shape": "7b", "activation_checkpointing": True,
     "epoch_tokens": 10},
    {"arch": "llama_tiny", "data": "synthetic_tokens", "activation_checkpointing": False},
    {"arch": "resnet50", "data": "cifar10", "data_path": "/d", "download": True},
    {"arch": "small_cnn", "data": "imagefolder", "data_path": "/d"},
    {"arch": "gpt_bytes", "data": "python_stdlib", "eval_windows": 4, "naive_norm_eps": 1e-5},
    {"arch": "gpt", "data": "python_stdlib"},
])
def test_a_model_setting_where_it_means_something_passes(settings):
    cfg.check_model_settings("m", settings)


# --- the largest-batch searches ---

def test_the_largest_batch_models_must_be_single_gpu_uncompiled_models_of_the_run():
    runs = {"models": {"vit": {}, "cnn": {"gpus": 2}, "gpt": {"nodes": 2}, "llm": {"compile": True},
                       "one": {"gpus": 1, "nodes": 1, "compile": False}}}
    cfg.check_largest_batch({**runs, "largest_batch": {"models": ["vit", "one"]}})
    cfg.check_largest_batch(runs)
    cfg.check_largest_batch({**runs, "largest_batch": None})
    assert refused(cfg.check_largest_batch, {**runs, "largest_batch": {"models": ["resnet"]}}) == (
        "Config error at runs.largest_batch.models: resnet is not a model of this run (cnn, gpt, llm, one, vit). Fix: "
        "name one of them, or remove it.")
    for model in ("cnn", "gpt", "llm"):
        assert refused(cfg.check_largest_batch, {**runs, "largest_batch": {"models": [model]}}) == (
            f"Config error at runs.largest_batch.models: {model} is data-parallel or compiled; the search tries "
            "batches in one process, one step each. Fix: name its single-GPU, uncompiled model instead.")


def test_largest_batch_precisions_that_its_models_do_not_run_are_searched_nowhere():
    runs = {"models": {"vit": {"arch": "vit_b_16", "data": "synthetic_images", "batch_size": 8,
                               "precisions": ["fp32", "amp_bf16"]}},
            "precisions": ["fp32", "tf32", "amp_bf16"], "seeds": [0],
            "largest_batch": {"models": ["vit"], "precisions": ["tf32", "fp32"]}}
    cfg.check_largest_batch(runs)  # a runs.precisions override may leave a named precision unrun: not an error
    assert cfg.largest_batch_searches(runs) == [{"model": "vit", "precision": "fp32", "seed": 0}]


def test_the_searches_are_the_first_seeds_uncompiled_cells_and_share_the_seconds():
    runs = {"models": {"vit": {"seeds": [5, 6]}, "cnn": {}},
            "precisions": ["fp32", "amp_bf16", "amp_bf16_compile", "fp8_rowwise"], "seeds": [1, 2],
            "largest_batch": {"models": ["vit"]}}
    searches = cfg.largest_batch_searches(runs)
    assert searches == [{"model": "vit", "precision": "fp32", "seed": 5},
                        {"model": "vit", "precision": "amp_bf16", "seed": 5}]
    runs["largest_batch"] = {"models": ["cnn"]}
    assert [c["seed"] for c in cfg.largest_batch_searches(runs)] == [1, 1]
    assert cfg.largest_batch_searches({**runs, "largest_batch": None}) == []
    runs["largest_batch"] = {"models": ["vit", "cnn"], "precisions": ["amp_bf16"]}  # only what a claim reads
    assert cfg.largest_batch_searches(runs) == [{"model": "vit", "precision": "amp_bf16", "seed": 5},
                                                {"model": "cnn", "precision": "amp_bf16", "seed": 1}]
    # 600 s over fp32 (2 shares), tf32 (2) and two AMP searches (1 each): 100 s a share
    four = [{"precision": p} for p in ("fp32", "tf32", "amp_bf16", "apex_o1")]
    assert cfg.largest_batch_seconds(four, 600.0, "fp32") == 200.0
    assert cfg.largest_batch_seconds(four, 600.0, "tf32") == 200.0
    assert cfg.largest_batch_seconds(four, 600.0, "apex_o1") == 100.0
    assert cfg.largest_batch_seconds([{"precision": "amp_fp16"}] * 3, 100.0, "amp_fp16") == 33.33
    assert cfg.largest_batch_seconds([], 100.0, "amp_fp16") == 100.0


# --- the command and the Snakefile's wrapper ---

def test_config_check_says_what_would_run_or_exits_1_with_the_error(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("preset: smoke\nruns: {seeds: [0, 1]}\n")
    assert cli.main(["check", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: OK. preset: smoke set in the config; 24 cells.\n"
    other = tmp_path / "other.yaml"
    other.write_text("runs: {precisions: [fp32]}\n")
    assert cli.main(["check", str(good), str(other)]) == 0  # merged in order
    assert capsys.readouterr().out == f"{good}, {other}: OK. preset: smoke set in the config; 4 cells.\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: fast\n")
    assert cli.main(["check", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("ERROR: Config error at config.preset: 'fast' is not one of")
    apex = tmp_path / "apex.yaml"
    apex.write_text("preset: smoke\napex: {required: true, source: {url: null, path: null, tarball: null}}\n")
    assert cli.main(["check", str(apex)]) == 1
    assert capsys.readouterr().err.startswith("ERROR: Config error at config.apex.source: apex is required here")
    with pytest.raises(SystemExit) as usage:
        cli.main([])
    assert usage.value.code == 2 and "python -m amprepro.config" in capsys.readouterr().err


def test_a_gpu_probe_decides_the_preset_and_whether_apex_is_required(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("apex: {required: auto, source: {url: null, path: null, tarball: null}}\n")
    assert cli.checked([str(path)], probe=lambda: ([], "no nvidia-smi on PATH")) == (
        f"{path}: OK. preset: auto chose smoke because no nvidia-smi on PATH; 12 cells.")
    assert refused(cli.checked, [str(path)], probe=lambda: (["NVIDIA H200"], "nvidia-smi lists 1 GPU(s)")).startswith(
        "Config error at config.apex.source: apex is required here")


def test_stop_on_config_error_prints_the_message_alone(capsys):
    with pytest.raises(SystemExit) as stop, cfg.stop_on_config_error():
        raise cfg.ConfigError("Config error at x: y. Fix: z.")
    assert stop.value.code == 1 and stop.value.__cause__ is None and stop.value.__suppress_context__
    assert capsys.readouterr().err == "amprepro: Config error at x: y. Fix: z.\n"
    with pytest.raises(KeyError), cfg.stop_on_config_error():
        raise KeyError("not a config error")
    with cfg.stop_on_config_error():
        pass


def test_deep_merge_shares_no_nested_value_with_its_inputs():
    base, override = {"kept": {"list": [1]}}, {"new": {"list": [2]}}
    merged = cfg.deep_merge(base, override)
    merged["kept"]["list"].append(9)
    merged["new"]["list"].append(9)
    assert base == {"kept": {"list": [1]}} and override == {"new": {"list": [2]}}


def test_a_yaml_error_that_is_no_unclosed_construct_names_where_the_reader_stopped(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a:\n  b: 1\n c: 2\n")  # a block mapping with a context mark, but nothing left open
    assert refused(cfg.read_config_file, path) == (
        f"{path}, line 3, column 2: not valid YAML (\"expected <block end>, but found '<block mapping start>'\"). "
        "Fix: check the indentation, brackets and quotes on that line or the one before (a value with ': ' or ' #' "
        "needs quotes).")


def test_a_long_yaml_problem_is_cut_and_a_tab_in_it_gets_the_tab_fix():
    long = "x" * 150
    mark = yaml.Mark("c", 0, 0, 0, None, None)
    generic = reading._yaml_message(Path("c.yaml"), yaml.MarkedYAMLError(problem=long, problem_mark=mark))
    assert generic.startswith(f"c.yaml, line 1, column 1: not valid YAML ('{'x' * 119}... (152 characters)). Fix: ")
    unclosed = reading._yaml_message(Path("c.yaml"), yaml.MarkedYAMLError(
        context="while parsing a flow sequence", context_mark=mark, problem=long, problem_mark=mark))
    assert f"the reader stopped at line 1: '{'x' * 79}... (152 characters)). Fix: add its ]" in unclosed
    tab = reading._yaml_message(Path("c.yaml"), yaml.MarkedYAMLError(problem="found a\ttab", problem_mark=mark))
    assert tab.endswith("Fix: indent with spaces; YAML does not allow tabs there.")


def test_an_unknown_key_far_from_any_known_one_and_a_long_one(tmp_path):
    message = refused(cfg.validate_config, {"apex": {"zzzz": 1}})
    assert message == ("Config error at config.apex: unknown key 'zzzz'. Fix: remove it, or use one of the keys "
                       "allowed in config.apex: required, source, cuda_arch_list, cache_dir, build_jobs "
                       "(config.schema.yaml).")
    long = "k" * 100
    message = refused(cfg.validate_config, {long: 1})
    assert f"unknown key '{'k' * 79}... (102 characters)." in message


def test_a_quoted_number_is_found_below_a_models_name_and_in_a_field_that_may_be_null():
    assert refused(cfg.validate_config, {"runs": {"models": {"cnn": {"batch_size": "8"}}}}) == (
        "Config error at config.runs.models.cnn.batch_size: '8' is text (it is quoted in the file), where an integer "
        "is wanted. Fix: write 8 without quotes.")
    assert refused(cfg.validate_config, {"apex": {"build_jobs": "4"}}) == (
        "Config error at config.apex.build_jobs: '4' is text (it is quoted in the file), where an integer is wanted. "
        "Fix: write 4 without quotes.")
    # a word where a number is wanted is the schema's type error, not a quoted number
    assert refused(cfg.validate_config, {"runs": {"train": {"steps": "abc"}}}).startswith(
        "Config error at config.runs.train.steps: 'abc' is not of type 'integer'")


def test_the_run_matrix_checks_name_the_model():
    assert refused(smoke_runs, models={"cnn": {"batch_size": 1439}}).startswith(
        "Config error at runs.models.cnn.batch_size: 1439 is more than the 1438 samples")


def test_gpu_true_in_the_file_chooses_the_paper_preset_without_a_probe(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gpu: true\n")
    said = cli.checked([str(path)], probe=lambda: ([], "no nvidia-smi on PATH"))
    assert said.startswith(f"{path}: OK. preset: auto chose paper because the config says the jobs run on GPU nodes "
                           "(gpu: true); ")
    runs = cfg.resolve_runs(cfg.validate_config(cfg.deep_merge(BASE, {"preset": "paper"})), PRESETS, [], "x")[0]
    assert said.endswith(f"; {len(cfg.cells(runs))} cells.")


def test_config_help_names_the_command_and_what_check_does(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--help"])
    assert stopped.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m amprepro.config [-h] {check} ...")
    assert "Read and check a config, resolve the run matrix: one validation pass before any job, field-naming " \
           "messages." in out
    assert "would run, run nothing" not in out  # the description is the docstring's first line only
    assert "check read and validate config files; nothing in them is run" in out


def test_command_line_text_of_an_untyped_enum_becomes_its_value():
    # apex.required is `enum: [auto, true, false]` with no type: --config's "true" must become True to be valid
    given = {"apex": {"required": "true"}}
    assert cfg.validate_config(dict(given), command_line=given)["apex"]["required"] is True
    given = {"gpu": "true"}  # gpu's enum has the text "true" too: it stays text (gpus_for_jobs reads it)
    assert cfg.validate_config(dict(given), command_line=given)["gpu"] == "true"


def test_the_size_limit_and_the_schema_errors_come_before_any_coercion_fails():
    assert refused(cfg.validate_config, {"runs": {"seeds": [0] * 100_000}}).startswith(
        "Config error at config: more than 100000 values")
    # a float or a list where an untyped enum is wanted: the schema's message, not a TypeError of the coercion
    assert refused(cfg.validate_config, {"gpu": 2.0}).startswith("Config error at config.gpu: 2.0 is not one of")
    assert refused(cfg.validate_config, {"preset": ["smoke"]}).startswith(
        "Config error at config.preset: ['smoke'] is not one of")
