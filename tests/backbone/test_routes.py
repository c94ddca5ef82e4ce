"""Every route that installs the training software provides what the presets need, so no cell of a preset is skipped
for a missing package: requirements.txt (the venv `make run` builds) and the train env files of envs/.

An arch's package comes from models.ARCH_PACKAGES (an arch not listed is plain torch); what a model setting, optimizer
or precision needs is declared below, and a model setting the schema gains must be declared here too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from amprepro import presets
from amprepro.config import choose_preset, load_schema
from amprepro.train import models

REPO = Path(__file__).resolve().parents[2]
PRESETS = {path.stem: presets.read(path.parent, path.stem)  # a preset that includes others, composed
           for path in sorted((REPO / "config" / "presets").glob("*.yaml"))}

# What each model setting needs when it is set (truthy). None: nothing beyond torch and the data.
SETTING_NEEDS = {
    "arch": None,  # models.ARCH_PACKAGES
    "data": None,  # DATA_NEEDS
    "batch_size": None, "image_size": None, "seq_len": None, "channels_last": None,
    "compile": None,  # torch.compile is part of torch
    "fused_layer_norm": "apex", "apex_build": "apex",  # the full build or the shell: apex either way
    "gpus": None, "nodes": None, "sync_batchnorm": None,  # torch.distributed (nodes: srun, from Slurm, not a package)
    "activation_checkpointing": None, "epoch_tokens": None, "shape": None,  # torch.utils.checkpoint; a number
    "precisions": None, "seeds": None, "train": None,  # PRECISION_NEEDS, OPTIMIZER_NEEDS
    "eval_every": None, "eval_windows": None, "naive_norm_eps": None, "data_path": None,
    "gumbel_tau": None, "risky_layer_fp32": None,  # torch.nn.functional; torch.autocast
    "lora": None,  # amprepro.train.lora: torch alone (no peft)
    "download": "torchvision",  # cifar10's checksummed download
}
# python_stdlib: the interpreter's own files; cifar10: read with pickle and numpy; imagefolder: Pillow, which comes
# with torchvision.
DATA_NEEDS = {"digits": "scikit-learn", "synthetic_images": None, "synthetic_tokens": None, "python_stdlib": None,
              "cifar10": None, "imagefolder": "torchvision"}
PRECISION_NEEDS = {"apex_o1": "apex", "apex_o2": "apex", "fp8_tensorwise": "torchao", "fp8_rowwise": "torchao"}
OPTIMIZER_NEEDS = {"apex_fused_adam": "apex"}
GPU_NEEDS = {"nvml"}  # every GPU cell reports its energy through NVML
GPU_ONLY = {"apex", "nvml"}  # not needed (and not built) on a CPU-only machine

# A need, as the packages each kind of route installs. apex is built by the apex stage from a pinned source: the route
# provides its build front end (in the venv, pip comes with the venv, setuptools with torch, nvcc from the system).
PROVIDED_BY = {
    "pip": {"torch": ["torch"], "torchvision": ["torchvision"], "timm": ["timm"], "scikit-learn": ["scikit-learn"],
            "nvml": ["nvidia-ml-py"], "apex": ["ninja"], "torchao": ["torchao"]},
    "conda": {"torch": ["pytorch"], "torchvision": ["torchvision"], "timm": ["timm"], "scikit-learn": ["scikit-learn"],
              "nvml": ["nvidia-ml-py"], "apex": ["cuda-nvcc", "ninja", "setuptools", "pip", "packaging"],
              "torchao": ["torchao"]},
}
# Needs a route knowingly cannot meet, each with the reason docs/conda.md gives: its cells are skipped there with that
# reason (skip_cause "software"), and the test below checks that the doc says so.
KNOWN_GAPS = {("conda", "torchao"): "conda-forge has no torchao built for pytorch 2.13"}


def preset_models(preset_name: str) -> list[dict]:
    """The preset's models, each with its train settings and precisions resolved."""
    preset = PRESETS[preset_name]
    return [{**model, "train": {**preset["train"], **model.get("train", {})},
             "precisions": model.get("precisions", preset["precisions"])} for model in preset["models"].values()]


def needs_of(model: dict) -> set[str]:
    needs = {"torch", models.ARCH_PACKAGES.get(model["arch"]), DATA_NEEDS[model["data"]],
             OPTIMIZER_NEEDS.get(model["train"]["optimizer"]),
             OPTIMIZER_NEEDS.get(model["train"].get("apex_optimizer"))}
    needs |= {PRECISION_NEEDS.get(precision) for precision in model["precisions"]}
    needs |= {SETTING_NEEDS[key] for key, value in model.items() if value and SETTING_NEEDS[key]}
    return needs - {None}


def preset_needs(preset_names, gpu: bool) -> set[str]:
    needs = set().union(*(needs_of(model) for name in preset_names for model in preset_models(name)))
    return needs | GPU_NEEDS if gpu else needs - GPU_ONLY


def pip_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version
    return pins


def conda_packages(path: Path) -> set[str]:
    return {re.split(r"[=<>!~ ]", spec, maxsplit=1)[0] for spec in yaml.safe_load(path.read_text())["dependencies"]}


def train_envs() -> tuple[str, str]:
    """(GPU env, CPU env) as conda_check.smk chooses them."""
    smk = (REPO / "workflow" / "rules" / "conda_check.smk").read_text()
    chosen = re.search(r'^TRAIN_ENV = "\.\./\.\./(envs/\S+)" if GPUS else "\.\./\.\./(envs/\S+)"$', smk, re.M)
    return chosen.group(1), chosen.group(2)


def routes():
    """(route, kind, presets it must run, whether its jobs have a GPU)."""
    gpu_env, cpu_env = train_envs()
    cpu_preset = choose_preset("auto", [], "no GPU")["preset"]
    return [("requirements.txt", "pip", sorted(PRESETS), True),
            (gpu_env, "conda", sorted(PRESETS), True),
            (cpu_env, "conda", [cpu_preset], False)]


def test_every_model_setting_of_the_schema_is_declared_here():
    settings = set(load_schema()["$defs"]["model"]["properties"])
    assert settings == set(SETTING_NEEDS), f"declare what these model settings need in SETTING_NEEDS: " \
                                           f"{sorted(settings ^ set(SETTING_NEEDS))}"
    assert set(load_schema()["$defs"]["model"]["properties"]["data"]["enum"]) == set(DATA_NEEDS)


def test_the_declared_needs_are_real():
    assert set(models.ARCH_PACKAGES) <= set(load_schema()["$defs"]["model"]["properties"]["arch"]["enum"])
    paper = preset_needs(["paper"], gpu=True)
    assert {"torchvision", "timm", "apex", "nvml", "scikit-learn"} <= paper


@pytest.mark.parametrize("route,kind,presets,gpu", routes(), ids=lambda value: str(value))
def test_each_route_provides_every_package_its_presets_need(route, kind, presets, gpu):
    installed = set(pip_pins(REPO / route)) if kind == "pip" else conda_packages(REPO / route)
    missing = {need: [p for p in PROVIDED_BY[kind][need] if canonicalize_name(p) not in installed]
               for need in sorted(preset_needs(presets, gpu))}
    missing = {need: packages for need, packages in missing.items() if packages and (kind, need) not in KNOWN_GAPS}
    assert not missing, f"{route} lacks what presets {presets} need (cells would be skipped): {missing}"


def test_every_known_gap_is_documented_and_still_a_gap():
    conda_doc = (REPO / "docs" / "conda.md").read_text()
    gpu_env, _ = train_envs()
    for (kind, need), reason in KNOWN_GAPS.items():
        assert reason in conda_doc, f"docs/conda.md must say why the {kind} route lacks {need}: {reason!r}"
        assert not set(PROVIDED_BY[kind][need]) & conda_packages(REPO / gpu_env), \
            f"{gpu_env} now provides {need}: remove it from KNOWN_GAPS"


# Built on the meta device in a fresh interpreter: the distributions whose modules the build imported, other than
# torch, its own dependencies and numpy (which torch imports when it is there; every route pins it).
IMPORTED_BY_BUILD = """
import json, sys, torch
from importlib import metadata
from packaging.requirements import Requirement
before = set(sys.modules)
from amprepro.train import models
with torch.device("meta"):
    for arch, config in json.loads(sys.argv[1]).items():
        models.build(arch, config)
owners = metadata.packages_distributions()
new = {owner for name in set(sys.modules) - before for owner in owners.get(name.split(".")[0], [])}
allowed, todo = {"numpy", "amprepro"}, ["torch"]  # amprepro: the package itself, once installed (pip install -e .)
while todo:
    name = todo.pop()
    if name not in allowed:
        allowed.add(name)
        todo += [Requirement(r).name for r in metadata.requires(name) or [] if "extra ==" not in r]
print(json.dumps(sorted({d for d in new if d.lower() not in {a.lower() for a in allowed}})))
"""


def test_archs_not_in_arch_packages_build_with_torch_alone():
    """An arch missing from models.ARCH_PACKAGES must not need anything but torch."""
    archs = {model["arch"]: model for name in PRESETS for model in preset_models(name)}
    schema_archs = load_schema()["$defs"]["model"]["properties"]["arch"]["enum"]
    archs.update({arch: {} for arch in schema_archs if arch not in archs})
    plain = {arch: config for arch, config in archs.items() if arch not in models.ARCH_PACKAGES}
    done = subprocess.run([sys.executable, "-c", IMPORTED_BY_BUILD, json.dumps(plain)], capture_output=True,
                          text=True, cwd=REPO, env={"PYTHONPATH": str(REPO / "workflow")}, timeout=120)
    assert done.returncode == 0, f"an arch outside models.ARCH_PACKAGES does not build here:\n{done.stderr[-2000:]}"
    assert json.loads(done.stdout) == [], f"archs {sorted(plain)} import these packages besides torch: declare " \
                                          "them in models.ARCH_PACKAGES"


def test_the_venv_pins_agree_with_each_others_metadata():
    """Each pinned package that is installed at its pin accepts the pins of the others (torchvision 0.28.0 requires
    torch==2.13.0, ...): the venv `make test` builds from these pins, so this reads the packages' own metadata."""
    pins = pip_pins(REPO / "requirements.txt")
    checked = []
    for name, version in pins.items():
        try:
            installed = Version(metadata.version(name)).public
        except metadata.PackageNotFoundError:
            continue
        if installed != version:
            continue
        for requirement in map(Requirement, metadata.requires(name) or []):
            other = canonicalize_name(requirement.name)
            if other in pins and (requirement.marker is None or requirement.marker.evaluate({"extra": ""})):
                assert requirement.specifier.contains(pins[other], prereleases=True), \
                    f"{name}=={version} requires {requirement}, requirements.txt pins {other}=={pins[other]}"
                checked.append(f"{name}->{other}")
    assert "torchvision->torch" in checked and "timm->torchvision" in checked
