"""Static checks of the conda env files, their pins, the pin workflow and the docs (fast, no conda needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conda_offline_checks import REPO, spec_name

ENVS = sorted((REPO / "envs").glob("*.yaml"))
EXACT = re.compile(r"^(?P<name>[a-z0-9_.-]+)=(?P<version>\d[0-9a-z.]*)(=(?P<build>[a-z0-9_]+\*))?$")


def deps(env: Path) -> dict[str, re.Match]:
    return {spec_name(spec): EXACT.match(spec) for spec in yaml.safe_load(env.read_text())["dependencies"]}


def verified_pins() -> dict[str, str]:
    """package -> version from the table in docs/conda.md ("Pins and where they were checked")."""
    table = (REPO / "docs" / "conda.md").read_text().split("## Pins and where they were checked")[1].split("\n## ")[0]
    pins = {}
    for row in table.splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) == 4 and re.match(r"\d", cells[1]):
            for package in cells[0].split(","):
                pins[package.strip()] = cells[1].split()[0]
    return pins


def test_the_env_files_are_there():
    assert [env.name for env in ENVS] == ["report.yaml", "train-gpu.yaml", "train.yaml"]


@pytest.mark.parametrize("env", ENVS, ids=lambda env: env.name)
def test_env_file_pins_exact_versions_from_conda_forge_and_has_no_pip_section(env):
    content = yaml.safe_load(env.read_text())
    assert set(content) == {"channels", "dependencies"}
    assert content["channels"] == ["conda-forge", "nodefaults"]
    specs = content["dependencies"]
    assert all(isinstance(spec, str) for spec in specs), "no `pip:` section: pin files cannot carry pip packages"
    bad = [spec for spec in specs if not EXACT.match(spec)]
    assert not bad, f"not an exact `name=version[=build*]` pin: {bad}"
    assert len({spec_name(s) for s in specs}) == len(specs), "a package listed twice"


@pytest.mark.parametrize("env", ENVS, ids=lambda env: env.name)
def test_every_pin_was_checked_against_its_feedstock(env):
    verified = verified_pins()
    for name, match in deps(env).items():
        assert name in verified, f"{env.name}: {name} is not in docs/conda.md's table of checked pins"
        assert match["version"] == verified[name], f"{env.name}: {name}={match['version']}, checked: {verified[name]}"


def test_the_gpu_env_is_the_cpu_env_with_cuda_129_and_its_compiler():
    cpu, gpu = deps(REPO / "envs" / "train.yaml"), deps(REPO / "envs" / "train-gpu.yaml")
    for name, match in cpu.items():
        assert gpu[name]["version"] == match["version"], f"{name} differs between train and train-gpu"
    assert cpu["pytorch"]["build"] == "cpu_*"
    assert gpu["pytorch"]["build"] == gpu["torchvision"]["build"] == "cuda129_*"
    assert gpu["cuda-version"]["version"] == "12.9"
    assert gpu["cuda-nvcc"]["version"].startswith("12.9."), "apex needs nvcc's release == torch.version.cuda"
    for header in ("cuda-cudart-dev", "libcublas-dev", "libcusparse-dev", "libcusolver-dev", "libcurand-dev"):
        assert header in gpu, f"apex's extensions include {header}'s headers through torch"
    assert int(gpu["gxx_linux-64"]["version"].split(".")[0]) < 15, "CUDA 12.9's nvcc accepts gcc < 15"
    assert {"pip", "setuptools", "ninja", "packaging"} <= set(gpu), "apex's preflight checks these"


def test_all_envs_share_one_python():
    assert len({deps(env)["python"]["version"] for env in ENVS}) == 1


def test_rules_take_their_env_from_conda_check():
    smk = (REPO / "workflow" / "rules" / "conda_check.smk").read_text()
    rules = REPO / "workflow" / "rules"
    for variable in ("TRAIN_ENV", "REPORT_ENV"):
        assert re.search(rf"^{variable} = ", smk, re.M)
    for path in re.findall(r'"(\.\./\.\./envs/[^"]+\.yaml)"', smk):
        assert (rules / path).resolve().exists(), path
    for rule_file in rules.glob("*.smk"):
        for path in re.findall(r'conda:\s*\n\s*"([^"]+)"', rule_file.read_text()):
            assert (rules / path).resolve().exists(), f"{rule_file.name}: conda env {path} does not exist"


# No test of committed envs/*.linux-64.pin.txt files: none is committed (they come from the weekly pin workflow's PR,
# which needs conda-forge), and a loop over no files could not fail (issue 28). The format of snakedeploy's pin files
# is checked where real ones are made: tests/conda/test_conda_offline.py pins against the local channel.


def test_the_weekly_pin_workflow_pins_every_env_file():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "pin-envs.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # PyYAML reads the key `on` as True
    assert triggers["schedule"][0]["cron"] and "workflow_dispatch" in triggers
    job = workflow["jobs"]["pin"]
    assert job["env"]["CONDA_OVERRIDE_CUDA"] == "12.9"
    script = "\n".join(step.get("run", "") for step in job["steps"])
    command = next(line for line in script.splitlines() if "snakedeploy pin-conda-envs" in line).split()
    assert command[:4] == ["snakedeploy", "pin-conda-envs", "--conda-frontend", "conda"]
    assert sorted(command[4:]) == sorted(f"envs/{env.name}" for env in ENVS)


def test_readme_and_docs_give_the_command_the_offline_test_runs():
    from test_conda_offline import README_COMMAND

    command = " ".join(README_COMMAND)
    assert command in (REPO / "README.md").read_text()
    assert command in (REPO / "docs" / "conda.md").read_text()
