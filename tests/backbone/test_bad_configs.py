"""Configs people write: each bad one is refused with its field named, each unusual-but-valid one passes.

Every bad case goes through amprepro's own config checks in this process: the files through the function of
`python -m amprepro.config check` (amprepro.config.main), the `--config` values through the checks common.smk runs on
what Snakemake's own parser makes of them. A subset (E2E_BAD: every kind of case and every check that can stop a run,
the injection attempts and the longest values among them) also goes through real Snakemake, which must stop before any
job with the field named, no traceback, a bounded message and results/ untouched. Each valid case is a real
`snakemake -n -p` whose planned jobs carry the cleaned-up values. (Until issue 28 every bad case ran Snakemake: 78
startups, most of this file's CPU, for the same few checks.)"""

from __future__ import annotations

import hashlib
import json
import queue
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from snakemake.cli import parse_config
from snakemake.utils import update_config

from amprepro import config as amprepro_config
from amprepro.config import cli
from workflow_testing import REPO, copy_workflow, job_env, snakemake

MARKER = "PWNED"
LONG_NAME = "vit_b_16_channels_last_fused_adamw_compiled_batch128_seed_repeat_1"[:64]  # 64 characters
# (id, how, value, what the message must contain). how: "file" = YAML (a dict is dumped) given with --configfile;
# "main" = the text of config/config.yaml itself; "config" = --config arguments.
BAD = [
    ("preset", "file", {"preset": "fast"}, "config.preset"),
    ("gpu", "file", {"gpu": "maybe"}, "config.gpu"),
    ("unknown-key", "file", {"runz": {}}, "unknown key 'runz'. Did you mean `runs`? Fix: rename it to runs"),
    ("unknown-key-far", "file", {"colour": "red"}, "unknown key 'colour'. Fix: remove it"),
    ("runs-list", "file", {"runs": [1]}, "config.runs"),
    ("precision", "file", {"runs": {"precisions": ["fp8"]}}, "config.runs.precisions[0]"),
    ("precisions-empty", "file", {"runs": {"precisions": []}}, "config.runs.precisions"),
    ("seeds-empty", "file", {"runs": {"seeds": []}}, "config.runs.seeds"),
    ("seed-negative", "file", {"runs": {"seeds": [-1]}}, "config.runs.seeds[0]"),
    ("seed-2**32", "file", {"runs": {"seeds": [2**32]}}, "config.runs.seeds[0]"),
    ("seeds-repeated", "file", {"runs": {"seeds": [0, 0]}}, "config.runs.seeds"),
    ("seed-fraction", "file", {"runs": {"seeds": [1.5]}}, "config.runs.seeds[0]"),
    ("seed-word", "file", {"runs": {"seeds": ["zero"]}}, "config.runs.seeds[0]"),
    ("lr-negative", "file", {"runs": {"train": {"lr": -1}}}, "config.runs.train.lr"),
    ("lr-zero", "file", {"runs": {"train": {"lr": 0}}}, "config.runs.train.lr"),
    ("lr-word", "file", {"runs": {"train": {"lr": "fast"}}}, "config.runs.train.lr"),
    ("steps-zero", "file", {"runs": {"train": {"steps": 0}}}, "config.runs.train.steps"),
    ("steps-fraction", "file", {"runs": {"train": {"steps": 2.5}}}, "config.runs.train.steps"),
    ("warmup-too-long", "file", {"runs": {"train": {"warmup_steps": 500}}}, "runs.train.warmup_steps"),
    ("optimizer", "file", {"runs": {"train": {"optimizer": "lamb"}}}, "config.runs.train.optimizer"),
    ("apex-optimizer", "file", {"runs": {"train": {"apex_optimizer": "lamb"}}}, "config.runs.train.apex_optimizer"),
    ("weight-decay", "file", {"runs": {"train": {"weight_decay": -0.1}}}, "config.runs.train.weight_decay"),
    ("deterministic", "file", {"runs": {"train": {"deterministic": "maybe"}}}, "config.runs.train.deterministic"),
    ("train-unknown", "file", {"runs": {"train": {"momentum": 0.9}}}, "config.runs.train"),
    ("batch-zero", "file", {"runs": {"models": {"cnn": {"batch_size": 0}}}}, "config.runs.models.cnn.batch_size"),
    ("batch-beyond-digits", "file", {"runs": {"models": {"cnn": {"batch_size": 5000}}}}, "runs.models.cnn.batch_size"),
    ("batch-digits+1", "file", {"runs": {"models": {"cnn": {"batch_size": 1439}}}}, "runs.models.cnn.batch_size"),
    ("arch", "file", {"runs": {"models": {"cnn": {"arch": "resnet9000"}}}}, "config.runs.models.cnn.arch"),
    ("data", "file", {"runs": {"models": {"cnn": {"data": "imagenet"}}}}, "config.runs.models.cnn.data"),
    ("model-incomplete", "file", {"runs": {"models": {"new": {"arch": "small_cnn"}}}}, "runs.models.new"),
    ("name-newline", "file", {"runs": {"models": {"cnn\n": {"arch": "small_cnn", "data": "digits", "batch_size": 4}}}},
     "config.runs.models"),
    ("name-65", "file", {"runs": {"models": {"m" * 65: {"arch": "small_cnn", "data": "digits", "batch_size": 4}}}},
     "config.runs.models"),
    ("name-slash", "file", {"runs": {"models": {"a/b": {"arch": "small_cnn", "data": "digits", "batch_size": 4}}}},
     "config.runs.models"),
    ("name-dots", "file", {"runs": {"models": {"..": {"arch": "small_cnn", "data": "digits", "batch_size": 4}}}},
     "config.runs.models"),
    ("name-empty", "file", {"runs": {"models": {"": {"arch": "small_cnn", "data": "digits", "batch_size": 4}}}},
     "config.runs.models"),
    ("gpus-zero", "file", {"runs": {"models": {"cnn": {"gpus": 0}}}}, "config.runs.models.cnn.gpus"),
    ("batch-not-split", "file", {"runs": {"models": {"cnn": {"gpus": 3}}}}, "runs.models.cnn.batch_size"),
    ("checkpointing-cnn", "file", {"runs": {"models": {"cnn": {"activation_checkpointing": True}}}},
     "runs.models.cnn.activation_checkpointing"),
    ("epoch-tokens-digits", "file", {"runs": {"models": {"cnn": {"epoch_tokens": 1000}}}},
     "runs.models.cnn.epoch_tokens"),
    ("model-without-cell", "file", {"runs": {"precisions": ["fp32"], "models": {"cnn": {"precisions": ["apex_o1"]}}}},
     "runs.models.cnn.precisions"),
    ("model-seed-2**32", "file", {"runs": {"models": {"cnn": {"seeds": [2**32]}}}}, "config.runs.models.cnn.seeds[0]"),
    ("image-size", "file", {"runs": {"models": {"cnn": {"image_size": 4}}}}, "config.runs.models.cnn.image_size"),
    ("channels-last", "file", {"runs": {"models": {"cnn": {"channels_last": "sometimes"}}}},
     "config.runs.models.cnn.channels_last"),
    ("apex-required", "file", {"apex": {"required": "sometimes"}}, "config.apex.required"),
    ("apex-unknown", "file", {"apex": {"colour": "red"}}, "config.apex"),
    ("commit-word", "file", {"apex": {"source": {"commit": "not-a-sha"}}}, "config.apex.source.commit"),
    ("commit-newline", "file", {"apex": {"source": {"commit": "379937e1\n"}}}, "config.apex.source.commit"),
    ("ref-upload-pack", "file", {"apex": {"source": {"ref": f"--upload-pack=touch {MARKER}"}}},
     "config.apex.source.ref"),
    ("url-upload-pack", "file", {"apex": {"source": {"url": f"--upload-pack=touch {MARKER}"}}},
     "config.apex.source.url"),
    ("url-ext", "file", {"apex": {"source": {"url": f"ext::sh -c touch% {MARKER}"}}}, "config.apex.source.url"),
    ("url-http", "file", {"apex": {"source": {"url": "http://example.com/apex.git"}}}, "config.apex.source.url"),
    ("path-option", "file", {"apex": {"source": {"path": "-rf"}}}, "config.apex.source.path"),
    ("tarball-option", "file", {"apex": {"source": {"tarball": "--to-command=id", "url": None}}},
     "config.apex.source.tarball"),
    ("cache-dir-option", "file", {"apex": {"cache_dir": "--foo"}}, "config.apex.cache_dir"),
    ("arch-sm", "file", {"apex": {"cuda_arch_list": "sm_90"}}, "config.apex.cuda_arch_list"),
    ("arch-option", "file", {"apex": {"cuda_arch_list": "-9.0"}}, "config.apex.cuda_arch_list"),
    ("sha256", "file", {"apex": {"source": {"sha256": "xyz"}}}, "config.apex.source.sha256"),
    ("build-jobs", "file", {"apex": {"build_jobs": 0}}, "config.apex.build_jobs"),
    # a field that takes a number or its text keeps its range in every spelling (issue 41: "0" passed, and the plan
    # divided by a budget of 0); YAML's .nan and .inf pass every range check
    ("memory-limit-quoted-zero", "file", {"gpu_memory_limit_gib": "0"},
     "config.gpu_memory_limit_gib: 0 is less than or equal to the minimum of 0"),
    ("memory-limit-quoted-zero-float", "file", {"gpu_memory_limit_gib": "0.0"},
     "config.gpu_memory_limit_gib: 0.0 is less than or equal to the minimum of 0"),
    ("memory-limit-nan", "main", "preset: smoke\ngpu_memory_limit_gib: .nan\n",
     "config.gpu_memory_limit_gib: nan is not a finite number"),
    ("runtime-factor-quoted-zero", "file", {"resources": {"runtime_factor": "0"}},
     "config.resources.runtime_factor: 0 is less than or equal to the minimum of 0"),
    ("lr-inf", "main", "preset: smoke\nruns:\n  train:\n    lr: .inf\n", "config.runs.train.lr: inf is not a finite"),
    ("no-apex-source", "file", {"apex": {"required": True, "source": {"url": None, "path": None, "tarball": None}}},
     "config.apex.source"),
    ("url-without-commit", "file", {"apex": {"source": {"commit": None}}}, "config.apex.source.commit"),
    ("title-nul", "file", {"report": {"title": "x\0y"}}, "config.report.title"),
    ("title-200k", "file", {"report": {"title": "t" * 200_000}}, "config.report.title"),
    ("title-newline", "file", {"report": {"title": "line\nline"}}, "config.report.title"),
    # 10**6 values from 7 lines, ten times the most a config may hold (config.MAX_NODES); Snakemake itself expands
    # the file before amprepro sees it, so each further level would cost that expansion ten times over
    ("alias-bomb", "file", "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcde", "bcdef")) + "report: {title: *f}\n",
     "at config:"),
    ("use-yte", "main", "__use_yte__: true\npreset: smoke\n", "config/config.yaml: sets __use_yte__"),
    ("yaml-syntax", "main", "preset: smoke\nruns:\n  seeds: [0,\n", "config/config.yaml, line 4, column 1"),
    # an unclosed quote or bracket: the line where it opens, not where the reader gave up (the end of the file)
    ("yaml-unclosed-quote", "main", 'preset: smoke\nreport:\n  title: "abc\nruns:\n  seeds: [0]\napex:\n  x: 1\n',
     "config/config.yaml, line 3, column 10: not valid YAML (a quoted value starts here and is not closed"),
    ("yaml-unclosed-list", "main", "preset: smoke\nruns:\n  seeds: [0,\n  train: {steps: 3}\nreport:\n  title: x\n",
     "config/config.yaml, line 3, column 10: not valid YAML (a [ list starts here"),
    ("yaml-tab", "main", "preset: smoke\nruns:\n\tseeds: [0]\n", "config/config.yaml, line 3, column 1"),
    ("latin-1", "main", b"preset: smoke\nreport:\n  title: caf\xe9\n", "config/config.yaml, line 3, column 13"),
    ("top-level-list", "main", "- preset\n", "config/config.yaml: holds a list"),
    ("cli-preset", "config", ["preset=fast"], "config.preset"),
    ("cli-seed", "config", ['runs={"seeds": [-1]}'], "config.runs.seeds[0]"),
    ("cli-lr", "config", ['runs={"train": {"lr": "abc"}}'], "config.runs.train.lr"),
    # --config values are checked as the same values in a file: the range, not the type of the text they arrive as
    ("cli-batch-negative", "config", ['runs={"models": {"cnn": {"batch_size": -8}}}'],
     "config.runs.models.cnn.batch_size: -8 is less than the minimum of 1"),
    ("cli-runtime-factor-zero", "config", ['resources={"runtime_factor": "0"}'],
     "config.resources.runtime_factor: 0 is less than or equal to the minimum of 0"),
    ("cli-steps-zero", "config", ['runs={"train": {"steps": 0}}'],
     "config.runs.train.steps: 0 is less than the minimum"),
    ("cli-key-typo", "config", ["prest=smoke"], "unknown key 'prest'. Did you mean `preset`?"),
    ("cli-ref", "config", [f'apex={{"source": {{"ref": "--upload-pack=touch {MARKER}"}}}}'], "config.apex.source.ref"),
]
VALID = [
    ("lr-exponent", "file", {"runs": {"train": {"lr": "1e-3"}}}),
    ("lr-exponent-yaml", "main", None),  # config/config.yaml with `lr: 1e-3` written by hand (YAML 1.1 reads text)
    ("runs-null", "file", {"runs": None}),
    ("report-null", "file", {"report": None, "apex": None}),
    ("steps-exponent", "file", {"runs": {"train": {"steps": "1.2e2"}}}),
    ("seed-2**32-1", "file", {"runs": {"seeds": [2**32 - 1]}}),
    ("name-64-batch-all-digits", "file",
     {"runs": {"models": {LONG_NAME: {"arch": "small_cnn", "data": "digits", "batch_size": 1438}}}}),
    ("ddp-even-batch", "file", {"runs": {"models": {"ddp": {"arch": "tiny_transformer", "data": "digits",
                                                            "batch_size": 64, "gpus": 2}}}}),
    ("title-literal", "file", {"report": {"title": "Ünï {x} {{y}} $(id) `id` \"q\" 's' <b>"}}),
    ("scp-url", "file", {"apex": {"source": {"url": "git@github.com:NVIDIA/apex.git", "ref": "release/25.05"}}}),
    ("cli-nested-numbers", "config",
     ['runs={"seeds": [0, 1], "train": {"lr": 1e-3, "steps": 50, "deterministic": true}}']),
    ("cli-readme-apex", "config",
     ['apex={"source": {"path": "vendor/apex-25.05", "commit": "379937e1", "url": null}}']),
    ("cli-apex-required", "config", ['apex={"required": false}', "gpu=false"]),
    ("json-file", "json", {"preset": "smoke", "runs": {"train": {"lr": 0.001}}}),
    ("memory-limit-quoted", "file", {"gpu_memory_limit_gib": "12"}),  # read as the number, with its range
]
# The bad cases that also run real Snakemake: each kind (file, config/config.yaml, --config), each place a stop comes
# from (the schema, an unknown key, the size check, the YAML reader, __use_yte__, resolve_runs' model and cell checks,
# the batch split, the apex source checks), the injection attempts (nothing may run: the marker) and the longest
# values (the message stays bounded). The rest differ from one of these only in the value checked in process below.
E2E_BAD = ["preset", "unknown-key", "seed-2**32", "warmup-too-long", "batch-not-split", "model-without-cell",
           "name-65", "ref-upload-pack", "url-ext", "no-apex-source", "title-200k", "alias-bomb", "use-yte",
           "yaml-unclosed-quote", "top-level-list", "memory-limit-quoted-zero", "cli-batch-negative", "cli-key-typo",
           "cli-ref"]
WORKERS = 3  # Snakemake runs at once, each in its own workflow copy


def workflow_with_results(root):
    """A workflow copy with results/ holding earlier outputs that no refused config may touch."""
    copy_workflow(root)
    for path, text in [("results/apex/apex.json", '{"status": "built"}'),
                       ("results/runs/cnn/fp32/seed0/metrics.json", '{"status": "ok"}')]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return workflow_with_results(tmp_path_factory.mktemp("bad_configs") / "amprepro")


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory) -> dict:
    """Every bad case through real Snakemake: its output, and whether results/ changed or the marker appeared."""
    free = queue.SimpleQueue()
    for index in range(WORKERS):
        free.put(workflow_with_results(tmp_path_factory.mktemp(f"bad_configs_{index}") / "amprepro"))

    def run(case):
        case_id, how, value, _ = case
        root = free.get()
        try:
            before = snapshot(root)
            args = arguments(root, case_id, how, value)
            result = snakemake(root, "--cores", "1", *args, "--", "results/environment/environment.json",
                               check=False)
            return case_id, (result, snapshot(root) == before, (root / MARKER).exists())
        finally:
            free.put(root)

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(run, [case for case in BAD if case[0] in E2E_BAD]))


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted((root / "results").rglob("*")) if p.is_file()}


def arguments(root, case_id: str, how: str, value) -> list[str]:
    """Snakemake's arguments for the case (written files included); config/config.yaml is restored first."""
    main = root / "config" / "config.yaml"
    original = (REPO / "config" / "config.yaml").read_bytes()
    main.write_bytes(original)
    if how == "config":
        return ["--config", "preset=smoke", *value]
    if how == "main":
        text = value if value is not None else original.decode().replace("runs: {}", "runs:\n  train:\n    lr: 1e-3")
        main.write_bytes(text if isinstance(text, bytes) else text.encode())
        return ["--config", "preset=smoke"] if "preset" not in str(text) else []
    extra = root / f"{case_id}.{'json' if how == 'json' else 'yaml'}"
    if how == "json":
        extra.write_text(json.dumps(value))
    else:
        extra.write_text(value if isinstance(value, str) else yaml.safe_dump({"preset": "smoke", **value}))
    return ["--configfile", str(extra)]


def config_files(root, args: list[str]) -> list[str]:
    return [args[1]] if args[:1] == ["--configfile"] else []


def test_the_end_to_end_cases_are_bad_cases_of_every_kind():
    kinds = {case[0]: case[1] for case in BAD}
    assert set(E2E_BAD) <= set(kinds) and {kinds[case_id] for case_id in E2E_BAD} == {"file", "main", "config"}


@pytest.mark.parametrize("case_id, how, value, field", [c for c in BAD if c[0] in E2E_BAD],
                         ids=[c[0] for c in BAD if c[0] in E2E_BAD])
def test_a_bad_config_stops_before_any_job_and_names_the_field(bad_runs, case_id, how, value, field):
    result, results_untouched, marker = bad_runs[case_id]
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-2000:]
    assert field in output, output[-2000:]
    assert "Traceback (most recent call last)" not in output, output[-3000:]
    assert 'File "' not in output, output[-3000:]  # no Python frames either
    assert len(output) < 6000, f"{len(output)} characters of output"
    assert results_untouched
    assert not marker


@pytest.mark.parametrize("case_id, how, value, field", [c for c in BAD if c[1] != "config"],
                         ids=[c[0] for c in BAD if c[1] != "config"])
def test_config_check_refuses_the_same_configs_without_running_them(workdir, case_id, how, value, field, monkeypatch,
                                                                     capsys):
    args = arguments(workdir, case_id, how, value)
    code, out, err = check_here(workdir, config_files(workdir, args), monkeypatch, capsys)
    assert code == 1, out
    assert field in err and "Traceback" not in err, err[-2000:]
    assert len(err) < 2000
    assert not (workdir / MARKER).exists()


def test_config_check_as_a_command_refuses_a_bad_file(workdir):
    """`python -m amprepro.config check` itself, in its own interpreter (the table above calls its main here)."""
    args = arguments(workdir, "preset", "file", {"preset": "fast"})
    result = check(workdir, config_files(workdir, args))
    assert result.returncode == 1 and "config.preset" in result.stderr and "Traceback" not in result.stderr, \
        result.stderr[-2000:]


@pytest.mark.parametrize("case_id, how, value, field", [c for c in BAD if c[1] == "config"],
                         ids=[c[0] for c in BAD if c[1] == "config"])
def test_a_bad_command_line_config_is_refused_by_the_workflows_checks(workdir, case_id, how, value, field,
                                                                        monkeypatch, capsys):
    """What common.smk does with the config Snakemake hands it, in this process: config/config.yaml as the Snakefile
    reads it, the `--config` values as Snakemake's own parser reads them, merged as Snakemake merges them; then the
    same checks in the same order, under stop_on_config_error (the message alone, exit 1)."""
    arguments(workdir, case_id, how, value)  # restores config/config.yaml
    monkeypatch.chdir(workdir)
    command_line = parse_config(["preset=smoke", *value])
    config = amprepro_config.read_config_file(workdir / "config" / "config.yaml")
    update_config(config, command_line)
    with pytest.raises(SystemExit) as stop, amprepro_config.stop_on_config_error():
        config.update(amprepro_config.validate_config(config, dict(command_line)))
        gpus, probe = amprepro_config.gpus_for_jobs(config.get("gpu", "auto"))
        runs, _ = amprepro_config.resolve_runs(config, workdir / "config" / "presets", gpus, probe)
        amprepro_config.cells(runs)
        amprepro_config.check_apex_source(config["apex"],
                                          amprepro_config.apex_required(config["apex"]["required"], gpus))
    err = capsys.readouterr().err
    assert stop.value.code == 1
    assert field in err and err.startswith("amprepro: ") and len(err) < 2000, err[-2000:]
    assert not (workdir / MARKER).exists()


DEFAULT_TITLE = "amprepro: which mixed-precision claims hold on this machine"
SMOKE_TRAIN = {"deterministic": False, "lr": 0.002, "optimizer": "adamw", "steps": 40, "warmup_steps": 10,
               "weight_decay": 0.0}
SMOKE_CELLS = 12  # 2 models x 6 precisions x seed 0


def exactly(value):
    """value, and of the same type: 120 is not 120.0 (a cell's range(steps) needs the int) and 1 is not True."""
    return lambda got: got == value and type(got) is type(value)


def train_is(**changed):
    """Every cell's train settings: the smoke preset's with these changed, each of the exact type."""
    expected = {**SMOKE_TRAIN, **changed}
    return lambda jobs: all(set(spec["train"]) == set(expected)
                            and all(exactly(expected[key])(spec["train"][key]) for key in expected)
                            for spec in jobs["specs"])


def cells_are(count, seeds=(0,)):
    return lambda jobs: len(jobs["specs"]) == count and {spec["seed"] for spec in jobs["specs"]} == set(seeds)


def a_model(name, **model_config):
    return lambda jobs: any(spec["model"] == name and all(exactly(v)(spec["model_config"].get(k))
                                                          for k, v in model_config.items()) for spec in jobs["specs"])


def apex_source_is(**source):
    return lambda jobs: all(exactly(v)(jobs["apex"]["source"][k]) if v is not None else jobs["apex"]["source"][k]
                            is None for k, v in source.items())


def title_is(title):
    return lambda jobs: jobs["title"] == title


DEFAULTS = [cells_are(SMOKE_CELLS), train_is(), title_is(DEFAULT_TITLE)]
# What each valid config must have become by the time it reaches the jobs' command lines (`snakemake -n -p`):
# not only that the dry run exits 0, but the cleaned-up values (numbers from text, floats that are integers made
# int, empty sections filled with the defaults).
EXPECTED = {
    "lr-exponent": [cells_are(SMOKE_CELLS), train_is(lr=0.001)],
    "lr-exponent-yaml": [cells_are(SMOKE_CELLS), train_is(lr=0.001)],
    "runs-null": DEFAULTS,
    # report: null replaces config.yaml's report section: the schema's default title, not config.yaml's
    "report-null": [cells_are(SMOKE_CELLS), train_is(), title_is("amprepro report"),
                    lambda jobs: jobs["apex"]["required"] is False,
                    apex_source_is(url="https://github.com/NVIDIA/apex.git", ref="25.05", commit="379937e1")],
    "steps-exponent": [cells_are(SMOKE_CELLS), train_is(steps=120)],
    "seed-2**32-1": [cells_are(SMOKE_CELLS, seeds=[2**32 - 1]), train_is()],
    "name-64-batch-all-digits": [cells_are(SMOKE_CELLS + 6), a_model(LONG_NAME, batch_size=1438, arch="small_cnn")],
    "ddp-even-batch": [cells_are(SMOKE_CELLS + 6), a_model("ddp", batch_size=64, gpus=2)],
    "title-literal": [cells_are(SMOKE_CELLS), title_is("Ünï {x} {{y}} $(id) `id` \"q\" 's' <b>")],
    "scp-url": [cells_are(SMOKE_CELLS), apex_source_is(url="git@github.com:NVIDIA/apex.git", ref="release/25.05")],
    "cli-nested-numbers": [cells_are(2 * SMOKE_CELLS, seeds=[0, 1]), train_is(lr=0.001, steps=50, deterministic=True)],
    "cli-readme-apex": [cells_are(SMOKE_CELLS), apex_source_is(path="vendor/apex-25.05", commit="379937e1", url=None)],
    "cli-apex-required": [cells_are(SMOKE_CELLS), lambda jobs: jobs["apex"]["required"] is False],
    "json-file": [cells_are(SMOKE_CELLS), train_is(lr=0.001)],
    "memory-limit-quoted": [cells_are(SMOKE_CELLS), lambda jobs: jobs["limit_gib"] == "12.0"],
}


def planned_jobs(output: str) -> dict:
    """The cells' specs, the apex settings and the report title, from the shell commands of `snakemake -n -p`."""
    jobs = {"specs": [], "apex": None, "title": None, "limit_gib": None}
    for line in output.splitlines():
        if not line.startswith("Shell command: ") or line == "Shell command: None":
            continue
        args = shlex.split(line.removeprefix("Shell command: "))
        if "--spec" in args:
            jobs["specs"].append(json.loads(args[args.index("--spec") + 1]))
        if "amprepro.env.apex_stage" in args:
            jobs["apex"] = json.loads(args[args.index("--settings") + 1])
        if "--run" in args and args[args.index("--run") + 1] == "plan" and "--limit-gib" in args:
            jobs["limit_gib"] = args[args.index("--limit-gib") + 1]
        if "amprepro.report.render" in args:
            jobs["title"] = next(a.removeprefix("title=") for a in args if a.startswith("title="))
    return jobs


def test_every_valid_case_says_what_it_must_become():
    assert set(EXPECTED) == {case[0] for case in VALID}


@pytest.mark.parametrize("case_id, how, value", VALID, ids=[case[0] for case in VALID])
def test_an_unusual_but_valid_config_passes(workdir, case_id, how, value, monkeypatch, capsys):
    before = snapshot(workdir)
    args = arguments(workdir, case_id, how, value)
    result = snakemake(workdir, "-n", "-p", "--cores", "1", *args, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert snapshot(workdir) == before
    jobs = planned_jobs(result.stdout)
    failed = [index for index, expectation in enumerate(EXPECTED[case_id]) if not expectation(jobs)]
    assert not failed, f"{case_id}: expectations {failed} do not hold for the planned jobs {jobs}"
    if how != "config":
        code, out, err = check_here(workdir, config_files(workdir, args), monkeypatch, capsys)
        assert code == 0 and ": OK." in out, err


def test_config_check_as_a_command_passes_a_valid_file(workdir):
    args = arguments(workdir, "json-file", "json", {"preset": "smoke", "runs": {"train": {"lr": 0.001}}})
    result = check(workdir, config_files(workdir, args))
    assert result.returncode == 0 and ": OK." in result.stdout, result.stderr


def check_here(root, files: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`python -m amprepro.config check FILES` in ROOT, through its main in this process: (exit code, stdout, stderr).
    Its REPO (where it finds config/config.yaml and the presets) is the workflow copy, as in the copy's interpreter."""
    monkeypatch.chdir(root)
    monkeypatch.setattr(cli, "REPO", root)
    capsys.readouterr()
    code = cli.main(["check", *(files or ["config/config.yaml"])])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check(root, files: list[str]) -> subprocess.CompletedProcess:
    env = {**job_env(), "PYTHONPATH": str(root / "workflow")}
    return subprocess.run([sys.executable, "-m", "amprepro.config", "check", *(files or ["config/config.yaml"])],
                          cwd=root, capture_output=True, text=True, env=env, timeout=120)
