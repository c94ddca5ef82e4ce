"""Build only the extensions the cells use (issue 40): the selection from the run matrix, the checked names, the
keep-extensions patch, MAX_JOBS for the selection, the cache key, the records, and the skip of a cell whose extension
the build left out."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from apex_fakes import REPO, Echo
from test_apex_plan import CUDA_TOOLS, KEY_INPUTS, SETUP_25_05

from amprepro import apexexts
from amprepro import config as cfg
from amprepro.env import apexbuild
from amprepro.env.apexbuild import patches, pipeline
from amprepro.env.apexbuild.build import ninja_slots, plan_build
from amprepro.env.apexbuild.setup_inspect import inspect_setup
from amprepro.env.apexbuild.source import Source
from amprepro.env.apexbuild.store import cache_key
from amprepro.env.apexbuild.toolchain import Toolchain
from amprepro.train import cellsupport

SOURCE = Source(kind="export", location="apex-fixture", ref="25.05", commit="0" * 40, verified_by="a test")


def spec(precision: str, optimizer: str = "adamw", apex_build: str = "full", **model) -> dict:
    return {"model": "m", "precision": precision, "seed": 0,
            "model_config": {"arch": "vit_b_16", "apex_build": apex_build, **model},
            "train": {"optimizer": optimizer}}


@pytest.mark.parametrize("cell, expected", [
    (spec("amp_fp16"), []),
    (spec("amp_bf16", optimizer="adamw_fused"), []),
    (spec("apex_o1"), ["amp_C"]),
    (spec("apex_o2"), ["amp_C"]),
    (spec("apex_o3"), ["amp_C"]),
    (spec("amp_fp16", optimizer="apex_fused_adam"), ["amp_C"]),
    (spec("amp_bf16", fused_layer_norm=True), ["fused_layer_norm_cuda"]),
    (spec("apex_o2", optimizer="apex_fused_adam", fused_layer_norm=True), ["amp_C", "fused_layer_norm_cuda"]),
    (spec("apex_o1", apex_build="shell", fused_layer_norm=True), []),  # the shell compiles nothing, by design
])
def test_each_use_of_apex_names_the_extensions_it_needs(cell, expected):
    assert apexexts.cell_extensions(cell) == expected


def test_the_paper_preset_needs_amp_c_and_fused_layer_norm_only():
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = cfg.validate_config(cfg.deep_merge(base, {"preset": "paper"}))
    runs, _ = cfg.resolve_runs(config, REPO / "config" / "presets", ["NVIDIA H200"], "test probe")
    cells = [cfg.cell_spec(runs, c["model"], c["precision"], c["seed"]) for c in cfg.cells(runs)]
    assert apexexts.run_extensions(cells) == ["amp_C", "fused_layer_norm_cuda"]
    without_fln = [c for c in cells if not c.model_config.get("fused_layer_norm")]
    assert apexexts.run_extensions(without_fln) == ["amp_C"]


def test_a_matrix_without_apex_cells_builds_amp_c_alone():
    """The lora preset uses no apex: its build compiled all 12 extensions (over five minutes on the H200 box) before
    this; now amp_C alone, while a matrix that uses FusedLayerNorm still gets it."""
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for preset, expected in (("lora", ["amp_C"]), ("paper", ["amp_C", "fused_layer_norm_cuda"])):
        config = cfg.validate_config(cfg.deep_merge(base, {"preset": preset}))
        runs, _ = cfg.resolve_runs(config, REPO / "config" / "presets", ["NVIDIA H200"], "test probe")
        cells = [cfg.cell_spec(runs, c["model"], c["precision"], c["seed"]) for c in cfg.cells(runs)]
        assert apexexts.run_extensions(cells) == (expected if preset == "paper" else [])
        assert apexexts.build_extensions(cells) == expected


SETUP = inspect_setup(SETUP_25_05, has_amp=True)


def test_the_selection_is_checked_before_it_reaches_setup_py():
    assert pipeline.select(SETUP, None, SOURCE) == ["apex_C", "amp_C", "fused_layer_norm_cuda",
                                                    "fused_weight_gradient_mlp_cuda"]
    assert pipeline.select(SETUP, ["fused_layer_norm_cuda", "amp_C"], SOURCE) == ["amp_C", "fused_layer_norm_cuda"]
    for bad in (["amp_C; rm -rf /"], ["--cuda_ext"], [3], "amp_C", [], ["a" * 65]):
        with pytest.raises(apexbuild.ApexError, match="extension"):
            pipeline.select(SETUP, bad, SOURCE)
    with pytest.raises(apexbuild.ApexError, match="xentropy_cuda.*does not build with --cpp_ext --cuda_ext"):
        pipeline.select(SETUP, ["amp_C", "xentropy_cuda"], SOURCE)  # a contrib flag's, not a core one's


def test_flags_follow_the_selection():
    assert SETUP.flags_for(["amp_C", "fused_layer_norm_cuda"]) == ["--cuda_ext"]
    assert SETUP.flags_for(["apex_C"]) == ["--cpp_ext"]
    assert SETUP.flags_for(["apex_C", "amp_C"]) == ["--cpp_ext", "--cuda_ext"]


def test_the_patch_keeps_only_the_selection_and_setup_py_still_parses(tmp_path):
    (tmp_path / "setup.py").write_text(SETUP_25_05)
    dropped = ["fused_weight_gradient_mlp_cuda"]
    assert patches.planned(SETUP, "12.8", dropped) == ["keep-extensions"]
    assert patches.planned(SETUP, "13.0", dropped) == ["drop-compute_70", "keep-extensions"]
    applied = patches.apply(patches.planned(SETUP, "13.0", dropped), tmp_path, dropped)
    patched = (tmp_path / "setup.py").read_text()
    assert inspect_setup(patched, has_amp=True).promised(["--cuda_ext"]) == {"amp_C": "cuda",
                                                                            "fused_layer_norm_cuda": "cuda"}
    assert 'cc_flag.append("arch=compute_80,code=sm_80")' in patched  # nothing else of its block goes
    assert applied[1]["left_out"] == dropped and '-        ext_modules.append(CUDAExtension(name="fused_weight' \
        in applied[1]["diff"]


def test_a_block_left_empty_gets_pass(tmp_path):
    (tmp_path / "setup.py").write_text(SETUP_25_05)
    patches.apply(["keep-extensions"], tmp_path, ["apex_C"])
    patched = (tmp_path / "setup.py").read_text()
    ast.parse(patched)
    assert 'sys.argv.remove("--cpp_ext")\n    pass\n' not in patched  # remove() stays: the block is not empty
    assert "apex_C" not in patched.split('if "--cpp_ext" in sys.argv:\n')[1].split("if ")[0]
    lone = "if x:\n    ext_modules.append(CUDAExtension(name='a', sources=['a.cu']))\ny = 1\n"
    (tmp_path / "setup.py").write_text(lone)
    patches.apply(["keep-extensions"], tmp_path, ["a"])
    assert (tmp_path / "setup.py").read_text() == "if x:\n    pass\ny = 1\n"


def test_an_extension_the_patch_cannot_find_stops_the_build(tmp_path):
    (tmp_path / "setup.py").write_text("ext_modules += [CUDAExtension(name='a', sources=['a.cu'])]\n")
    with pytest.raises(apexbuild.ApexError, match="cannot leave a out of the build"):
        patches.apply(["keep-extensions"], tmp_path, ["a"])


def test_max_jobs_gives_the_selection_every_core():
    # amp_C's sources all at once on 16, 8 and 7 cores (the H200's share beside the cells), not beyond 2.5x the cores
    assert ninja_slots([15, 2], 16) == ninja_slots([15, 2], 8) == ninja_slots([15, 2], 7) == 15
    assert ninja_slots([15, 2], 6) == 13
    full_25_05 = [1, 15] + [2] * 9 + [3]  # apex_C, amp_C, syncbn ... fused_rotary, fused_weight_gradient_mlp_cuda
    assert ninja_slots(full_25_05, 16) == 15 and ninja_slots(full_25_05, 8) == 2
    plan = plan_build(SETUP, ["--cuda_ext"], 16, None, CUDA_TOOLS, {}, ["amp_C", "fused_layer_norm_cuda"])
    assert plan.parallel == 2 and plan.options == ["--cuda_ext", "--parallel", "2"]
    assert plan_build(SETUP, ["--cuda_ext"], 16, None, CUDA_TOOLS, {"MAX_JOBS": "3"}, ["amp_C"]).max_jobs == 3


def test_the_real_25_05_setup_py_keeps_amp_c_and_fused_layer_norm_only(tmp_path):
    """On the pinned source itself (vendor/apex-25.05, exported where GitHub is unreachable; not in git)."""
    setup_py = REPO / "vendor" / "apex-25.05" / "setup.py"
    if not setup_py.is_file():
        pytest.skip("no apex 25.05 export in vendor/ here")
    text = setup_py.read_text()
    setup = inspect_setup(text, has_amp=True)
    assert setup.source_count("amp_C") == 15 and setup.source_count("fused_layer_norm_cuda") == 2
    wanted = ["amp_C", "fused_layer_norm_cuda"]
    assert len(setup.promised(setup.core_flags())) == 12 and setup.flags_for(wanted) == ["--cuda_ext"]
    dropped = [name for name in setup.promised(["--cuda_ext"]) if name not in wanted]
    (tmp_path / "setup.py").write_text(text)
    applied = patches.apply(patches.planned(setup, "13.0", dropped), tmp_path, dropped)
    assert [p["name"] for p in applied] == ["drop-compute_70", "keep-extensions"] and len(dropped) == 9
    patched = inspect_setup((tmp_path / "setup.py").read_text(), has_amp=True)
    assert patched.promised(["--cuda_ext"]) == {"amp_C": "cuda", "fused_layer_norm_cuda": "cuda"}
    assert patched.promised(["--xentropy"]) == setup.promised(["--xentropy"])  # other flags' blocks untouched


def test_the_selection_is_in_the_key_and_the_full_build_keeps_its_key():
    python = {"torch": "2.11.0+cu130", "torch_git": "abc", "torch_cuda": "13.0",
              "soabi": "cpython-312-x86_64-linux-gnu", "python": "3.12"}
    tools = Toolchain(python, CUDA_TOOLS.nvcc, None, "9.0", "apex.cuda_arch_list")
    full = pipeline.key_inputs(SOURCE, tools, ["--cpp_ext", "--cuda_ext"])
    assert "extensions" not in full
    some = pipeline.key_inputs(SOURCE, tools, ["--cuda_ext"], extensions=["fused_layer_norm_cuda", "amp_C"])
    assert some["extensions"] == ["amp_C", "fused_layer_norm_cuda"]
    fewer = pipeline.key_inputs(SOURCE, tools, ["--cuda_ext"], extensions=["amp_C"])
    assert len({cache_key(full), cache_key(some), cache_key(fewer)}) == 3
    assert cache_key({**KEY_INPUTS, "extensions": ["amp_C"]}) != cache_key(KEY_INPUTS)


@pytest.fixture(scope="module")
def selected(built, tmp_path_factory):
    """fake_apex (apex_C and apex_version_C under --cpp_ext) built with only apex_C: a real compile."""
    results = tmp_path_factory.mktemp("selected") / "results"
    settings = {**built.settings, "cache_dir": None, "extensions": ["apex_C"]}
    echo = Echo()
    build = apexbuild.build_only(settings, jobs=2, results_dir=results, env=built.env, echo=echo)
    record = apexbuild.build_and_verify(settings, jobs=2, results_dir=results, env=built.env, echo=echo, built=build)
    return build, record, echo


def test_a_selected_build_compiles_records_and_verifies_only_its_extensions(built, selected):
    build, record, echo = selected
    assert build["extensions_built"] == ["apex_C"] and build["extensions_left_out"] == ["apex_version_C"]
    assert build["key"] != built.key and build["cache"] == "miss (built)"
    assert record["extensions_built"] == ["apex_C"] and record["extensions_left_out"] == ["apex_version_C"]
    assert list(record["extensions"]) == ["apex_C"] and record["extensions"]["apex_C"]["importable"]
    assert record["verification"]["checks"]["apex_C"]["ok"]  # the round trip of the one it built
    manifest = record["manifest"]
    assert manifest["key_inputs"]["extensions"] == ["apex_C"] and manifest["extensions_promised"] == ["apex_C"]
    assert [p["name"] for p in manifest["patches"]] == ["keep-extensions"]
    names = zipfile.ZipFile(Path(build["entry"]) / manifest["wheel"]["file"]).namelist()
    assert any(n.startswith("apex_C.") for n in names) and not any(n.startswith("apex_version_C") for n in names)
    assert any("left out (no cell uses them): apex_version_C" in line for line in echo.lines)
    assert not record["shell"]  # a selection is not the shell: pipeline.require_kind still tells them apart


def test_a_cell_needing_an_extension_the_build_left_out_is_skipped_with_the_fix():
    view = {"status": "built", "shell": False, "extensions_built": ["amp_C"], "has_amp": True}
    cause = cellsupport.skip_cause(spec("amp_bf16", fused_layer_norm=True), torch.device("cpu"), view)
    assert cause[0] == "software" and "fused_layer_norm_cuda" in cause[2]
    assert "put this cell in the run matrix" in cause[2] and "apex_build" in cause[2]
    assert apexexts.missing(spec("apex_o1"), view) == []
    assert apexexts.missing(spec("amp_bf16", fused_layer_norm=True), {**view, "extensions_built": None}) == []


def test_a_patch_that_did_not_take_is_refused(built, tmp_path, monkeypatch):
    """The record says what was left out, so the wheel is checked for it: a no-op patch builds both and is refused."""
    monkeypatch.setattr(patches, "apply", lambda names, source_dir, left_out=(): [])
    settings = {**built.settings, "cache_dir": None, "extensions": ["apex_C"]}
    with pytest.raises(apexbuild.ApexError, match="leave out apex_version_C .* the wheel has them"):
        apexbuild.build_only(settings, jobs=2, results_dir=tmp_path / "results", env=built.env, echo=Echo())
    assert not list((tmp_path / "results" / "build").glob("[0-9a-f]*"))  # nothing published
