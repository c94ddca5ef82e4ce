from pathlib import Path

import pytest
import yaml

from amprepro import config as cfg

PRESETS = Path(__file__).resolve().parents[2] / "config" / "presets"
BASE = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "config.yaml").read_text())


def resolve(overrides=None, preset="smoke", gpus=()):
    config = cfg.deep_merge(BASE, {"preset": preset, **(overrides or {})})
    return cfg.resolve_runs(cfg.validate_config(config), PRESETS, list(gpus), "test probe")


def test_auto_picks_paper_with_a_gpu_and_smoke_without():
    assert cfg.choose_preset("auto", ["NVIDIA H200"], "nvidia-smi lists 1 GPU(s)")["preset"] == "paper"
    choice = cfg.choose_preset("auto", [], "no nvidia-smi on PATH")
    assert choice["preset"] == "smoke" and "no nvidia-smi on PATH" in choice["reason"]
    assert cfg.choose_preset("paper", [], "x") == {"preset": "paper", "reason": "preset: paper set in the config"}


def test_overrides_merge_key_by_key():
    runs, _ = resolve({"runs": {"models": {"cnn": {"batch_size": 8}}, "seeds": [1, 2]}})
    assert runs["models"]["cnn"] == {"arch": "small_cnn", "data": "digits", "batch_size": 8}
    assert "transformer" in runs["models"] and runs["seeds"] == [1, 2]


def test_cells_cover_the_whole_matrix():
    runs, _ = resolve({"runs": {"seeds": [0, 1]}})
    cells = cfg.cells(runs)
    assert len(cells) == len(runs["models"]) * len(runs["precisions"]) * 2
    assert {"model": "transformer", "precision": "apex_o2", "seed": 1} in cells


def test_cell_spec_holds_only_its_own_model():
    runs, _ = resolve()
    before = cfg.cell_spec_json(runs, "cnn", "fp32", 0)
    runs["models"]["transformer"]["batch_size"] = 7
    assert cfg.cell_spec_json(runs, "cnn", "fp32", 0) == before
    runs["models"]["cnn"]["batch_size"] = 7
    assert cfg.cell_spec_json(runs, "cnn", "fp32", 0) != before


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"runs": {"precisions": ["fp8"]}}, "config.runs.precisions[0]"),
        ({"runs": {"models": {"cnn": {"batch_size": 0}}}}, "config.runs.models.cnn.batch_size"),
        ({"runs": {"models": {"cnn": {"arch": "resnet9000"}}}}, "config.runs.models.cnn.arch"),
        ({"runs": {"train": {"lr": -1}}}, "config.runs.train.lr"),
        ({"runs": {"seeds": []}}, "config.runs.seeds"),
        ({"runs": {"models": {"new": {"arch": "small_cnn"}}}}, "runs.models.new"),
        ({"preset": "fast"}, "config.preset"),
        ({"apex": {"source": {"commit": "not-a-sha"}}}, "config.apex.source.commit"),
        ({"apex": {"cuda_arch_list": "sm_90"}}, "config.apex.cuda_arch_list"),
        ({"apex": {"colour": "red"}}, "config.apex"),
        ({"runs": {"train": {"warmup_steps": 500}}}, "runs.train.warmup_steps (model cnn)"),
        ({"runs": {"train": {"lr_warmup_steps": 500}}}, "runs.train.lr_warmup_steps (model cnn)"),
        ({"runs": {"train": {"lr_warmup_steps": -1}}}, "config.runs.train.lr_warmup_steps"),
        ({"runs": {"models": {"cnn": {"activation_checkpointing": True}}}},
         "runs.models.cnn.activation_checkpointing"),
        ({"runs": {"models": {"cnn": {"epoch_tokens": 1000}}}}, "runs.models.cnn.epoch_tokens"),
        ({"runs": {"train": {"apex_optimizer": "lamb"}}}, "config.runs.train.apex_optimizer"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    overrides = dict(overrides)  # the parameter itself stays as it was: the test can run again in this process
    preset = overrides.pop("preset", "smoke") if "preset" in overrides else "smoke"
    config = cfg.deep_merge(BASE, overrides)
    config["preset"] = preset
    with pytest.raises(cfg.ConfigError) as error:
        cfg.resolve_runs(cfg.validate_config(config), PRESETS, [], "test probe")
    assert f"at {field}:" in str(error.value), str(error.value)
    assert "Fix" in str(error.value)


def test_apex_required_follows_the_gpu():
    assert cfg.apex_required("auto", ["NVIDIA H200"]) is True
    assert cfg.apex_required("auto", []) is False
    assert cfg.apex_required(True, []) is True


def test_merged_preset_missing_a_key_names_it(tmp_path):
    (tmp_path / "smoke.yaml").write_text(yaml.safe_dump({"models": {"cnn": {"arch": "small_cnn", "data": "digits"}},
                                                         "precisions": ["fp32"], "seeds": [0],
                                                         "train": {"steps": 5, "warmup_steps": 1, "lr": 0.1,
                                                                   "optimizer": "sgd"}}))
    with pytest.raises(cfg.ConfigError, match=r"at runs\.models\.cnn: 'batch_size' is a required property"):
        cfg.resolve_runs(cfg.validate_config({**BASE, "preset": "smoke"}), tmp_path, [], "test probe")


def test_model_overrides_restrict_precisions_seeds_and_train():
    runs, _ = resolve({"runs": {"models": {"cnn": {"precisions": ["fp32"], "seeds": [3, 4], "train": {"steps": 19}}}}})
    cnn_cells = [c for c in cfg.cells(runs) if c["model"] == "cnn"]
    assert cnn_cells == [{"model": "cnn", "precision": "fp32", "seed": 3},
                         {"model": "cnn", "precision": "fp32", "seed": 4}]
    spec = cfg.cell_spec_dict(runs, "cnn", "fp32", 3)
    assert spec["train"]["steps"] == 19 and spec["train"]["lr"] == runs["train"]["lr"]
    assert "precisions" not in spec["model_config"] and "train" not in spec["model_config"]


def test_paper_preset_is_valid_and_has_every_precision_for_the_three_models():
    """Every precision but the compiled ones, which the fp8 preset runs on ViT-B/16 and GPT-124M (docs/fp8.md), and
    apex O3, which is judged on real data (issue 38: five more paper cells would cost ~45 s of the 30 s budget)."""
    from amprepro import precisions

    runs, _ = resolve(preset="paper")
    fp8_runs, _ = resolve(preset="fp8")
    cells, fp8_cells = cfg.cells(runs), cfg.cells(fp8_runs)
    every_precision = set(cfg.load_schema()["$defs"]["precision"]["enum"])
    compiled = {p.name for p in precisions.REGISTRY.values() if p.compile}
    left_out = {"apex_o3",  # "O3 is for inference, not training": judged on the accuracy preset's real text
                "amp_fp16_unscaled"}  # timm's recipe: tools/gpu/timm_compare.py runs it, no preset does
    for model in ("resnet50", "vit_b_16", "gpt124m"):
        assert {c["precision"] for c in cells if c["model"] == model} == every_precision - compiled - left_out
    for model in ("vit_b_16", "gpt124m"):
        assert {c["precision"] for c in cells + fp8_cells if c["model"] == model} == every_precision - left_out


def test_gpu_setting_overrides_the_local_probe():
    def no_probe():
        raise AssertionError("nvidia-smi must not be asked when the config decides")

    assert cfg.gpus_for_jobs(True, no_probe)[0] == ["configured GPU"]
    assert cfg.gpus_for_jobs(False, no_probe)[0] == []
    assert cfg.gpus_for_jobs("auto", lambda: (["NVIDIA H200"], "probe"))[0] == ["NVIDIA H200"]


def test_a_quoted_number_in_a_file_is_refused_but_the_same_text_from_the_command_line_is_read():
    with pytest.raises(cfg.ConfigError, match=r"config\.runs\.seeds\[0\]: '0' is text .* Fix: write 0 without quotes"):
        cfg.validate_config({"runs": {"seeds": ["0", "1"]}})
    given = {"runs": {"seeds": ["0", "1"], "train": {"steps": "5"}}}  # what Snakemake makes of --config runs=...
    assert cfg.validate_config(given, command_line=given)["runs"]["seeds"] == [0, 1]
    assert cfg.validate_config({"runs": {"train": {"lr": "1e-3"}}})["runs"]["train"]["lr"] == 0.001  # YAML 1.1 text


@pytest.mark.parametrize("warmup, steps, refused", [(120, 120, True), (121, 120, True), (119, 120, False)])
def test_warmup_must_leave_at_least_one_timed_step(warmup, steps, refused):
    overrides = {"runs": {"train": {"warmup_steps": warmup, "steps": steps}}}
    if not refused:
        runs, _ = resolve(overrides)
        assert (runs["train"]["warmup_steps"], runs["train"]["steps"]) == (warmup, steps)
        return
    with pytest.raises(cfg.ConfigError) as error:
        resolve(overrides)
    assert str(error.value) == (f"Config error at runs.train.warmup_steps (model cnn): {warmup} warm-up steps leave "
                                f"no timed step out of {steps}. Fix: make warmup_steps smaller than steps.")


def test_a_models_own_train_settings_are_checked_for_warmup_too():
    with pytest.raises(cfg.ConfigError, match=r"warmup_steps \(model transformer\): 30 warm-up steps .* out of 30"):
        resolve({"runs": {"models": {"transformer": {"train": {"steps": 30, "warmup_steps": 30}}}}})


@pytest.mark.parametrize("written, expected", [
    ({"runs": {"train": {"steps": "1.2e2"}}}, ("train", "steps", 120)),
    ({"runs": {"train": {"steps": 120.0}}}, ("train", "steps", 120)),
    ({"runs": {"train": {"warmup_steps": "1e1"}}}, ("train", "warmup_steps", 10)),
    ({"runs": {"seeds": [1.0, 2]}}, ("seeds", None, [1, 2])),  # a quoted "2" in a file is refused: test below
    ({"runs": {"train": {"lr": "1e-3"}}}, ("train", "lr", 0.001)),
    ({"runs": {"train": {"lr": 1}}}, ("train", "lr", 1)),
])
def test_numbers_written_as_text_or_floats_become_the_type_the_schema_asks_for(written, expected):
    section, key, value = expected
    config = cfg.validate_config(cfg.deep_merge(BASE, {"preset": "smoke", **written}))
    got = config["runs"][section] if key is None else config["runs"][section][key]
    assert got == value and type(got) is type(value), (got, type(got))
    runs, _ = cfg.resolve_runs(config, PRESETS, [], "test probe")
    spec = cfg.cell_spec_dict(runs, "cnn", "fp32", runs["seeds"][0])
    if section == "train":
        assert type(spec["train"][key]) is type(value)  # what the cell gets: range(steps) needs an int


def test_a_fraction_is_not_made_an_integer():
    with pytest.raises(cfg.ConfigError, match=r"config\.runs\.train\.steps"):
        cfg.validate_config(cfg.deep_merge(BASE, {"runs": {"train": {"steps": 2.5}}}))
    assert cfg.normalized({"runs": {"train": {"lr": 2.0}}})["runs"]["train"]["lr"] == 2.0  # a number stays a float
