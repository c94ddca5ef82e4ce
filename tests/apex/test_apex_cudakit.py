"""Which nvcc apex builds with (amprepro.env.apexbuild.cudakit): a system one matching torch's CUDA release, else the
pinned pip toolkit, installed into the env. Fake nvcc scripts stand in for toolkits; fake wheels with the names,
versions and extras of requirements-cuda13.0.txt stand in for NVIDIA's, installed by the real pip with --no-index."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from apex_fakes import REPO, fake_cuda, fake_cuda_wheels, fake_python_packages, python_env
from test_apex_preflight import CUDA_FLAGS, STRICT_SETUP

from amprepro.env.apexbuild import ApexError, cudakit
from amprepro.env.apexbuild.build import plan_build
from amprepro.env.apexbuild.pipeline import toolkit_record
from amprepro.env.apexbuild.preflight import preflight
from amprepro.env.apexbuild.setup_inspect import inspect_setup
from amprepro.env.apexbuild.toolchain import Toolchain, find_nvcc, survey

REQUIREMENTS = REPO / "requirements-cuda13.0.txt"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    return fake_cuda_wheels(tmp_path_factory.mktemp("cuda_wheels"), REQUIREMENTS)


@pytest.fixture
def torch13(bare_env, tmp_path) -> dict:
    """A CUDA 13.0 torch (stand-in) whose site-packages holds its CUDA wheels' headers, as torch's does."""
    py = fake_python_packages(tmp_path / "py")
    (py / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (py / "nvidia" / "cu13" / "include" / "cusparse.h").write_text("/* fake */\n")
    return python_env(bare_env, py)


def offline(env: dict, wheels: Path) -> dict:
    return {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}


def choose(env: dict, tmp_path: Path):
    """What survey does for a CUDA 13.0 torch whose site-packages is the stand-in's (PYTHONPATH)."""
    system, problem = find_nvcc(env)
    return cudakit.choose(env, "13.0", system, problem, prefix=tmp_path / "venv", torch_site=env["PYTHONPATH"],
                          echo=lambda *a, **k: None)


def test_a_matching_system_nvcc_is_used_and_nothing_installed(torch13, tmp_path):
    home = fake_cuda(tmp_path / "cuda", release="13.0")
    tools = survey(True, {**torch13, "CUDA_HOME": str(home)}, "9.0", echo=lambda *a, **k: None)
    assert tools.nvcc.source == "system" and tools.nvcc.path == str(home / "bin" / "nvcc")
    assert tools.nvcc.reason == "nvcc 13.0 (CUDA_HOME) matches torch's CUDA 13.0" and tools.nvcc.env == {}
    assert not (tmp_path / "venv").exists()


def test_a_mismatched_system_nvcc_gives_way_to_pip(torch13, wheels, tmp_path):
    old = fake_cuda(tmp_path / "cuda12", release="12.8")
    env = offline({**torch13, "PATH": f"{old / 'bin'}:{torch13['PATH']}"}, wheels)
    nvcc, problem = choose(env, tmp_path)
    assert problem is None and nvcc.source == "pip" and nvcc.release == "13.0"
    assert f"nvcc 12.8 at {old / 'bin' / 'nvcc'} (PATH) does not match torch's CUDA 13.0" in nvcc.reason
    home = Path(nvcc.cuda_home)
    assert home.parent.parent.parent == tmp_path / "venv" / "amprepro-cuda"  # inside the env
    assert home.relative_to(tmp_path / "venv").parts[2:] == ("nvidia", "cu13")
    # the environment the build gets: CUDA_HOME, the pip bin first on PATH (before the old toolkit), torch's headers
    assert nvcc.env["CUDA_HOME"] == str(home)
    assert nvcc.env["PATH"].split(os.pathsep)[:2] == [str(home / "bin"), str(old / "bin")]
    assert nvcc.env["CPATH"] == str(Path(env["PYTHONPATH"]) / "nvidia" / "cu13" / "include")
    link = home / "lib" / "libcudart.so"
    assert link.is_symlink() and os.readlink(link) == "libcudart.so.13" and link.resolve().is_file()
    marker = json.loads((home.parents[1] / ".amprepro-cuda.json").read_text())
    assert marker["cuda_toolkit"] == "13.0.2" and "nvidia_nvvm-13.0.88" in marker["installed"]
    assert not list((tmp_path / "venv" / "amprepro-cuda").glob(".tmp-*"))


def test_no_nvcc_at_all_takes_the_pip_route_once(torch13, wheels, tmp_path):
    first, _ = choose(offline(torch13, wheels), tmp_path)
    assert first.source == "pip" and first.reason.startswith("no nvcc on this machine")
    # installed once: the second choice finds it even with no wheels reachable
    again, _ = choose({**torch13, "PIP_FIND_LINKS": str(tmp_path / "nothing")}, tmp_path)
    assert again.cuda_home == first.cuda_home and again.release == "13.0"


def test_pip_route_record_for_build_json(torch13, wheels, tmp_path):
    nvcc, _ = choose(offline(torch13, wheels), tmp_path)
    record = toolkit_record(Toolchain({}, nvcc, None, "9.0", "apex.cuda_arch_list"))
    assert record["source"] == "pip" and record["release"] == "13.0" and record["nvcc"].endswith("/cu13/bin/nvcc")
    assert "nvcc from pip (requirements-cuda13.0.txt)" in record["reason"]
    assert toolkit_record(Toolchain({}, None, None, None, "not needed"))["reason"].startswith("no CUDA extension")


def test_forcing_pip_over_a_matching_system_nvcc(torch13, wheels, tmp_path):
    home = fake_cuda(tmp_path / "cuda", release="13.0")
    nvcc, _ = choose(offline({**torch13, "CUDA_HOME": str(home), "AMPREPRO_NVCC": "pip"}, wheels), tmp_path)
    assert nvcc.source == "pip" and nvcc.reason.startswith("AMPREPRO_NVCC=pip")


def test_forcing_system_keeps_a_mismatch_for_the_preflight(torch13, tmp_path):
    old = fake_cuda(tmp_path / "cuda12", release="12.8")
    nvcc, _ = choose({**torch13, "CUDA_HOME": str(old), "AMPREPRO_NVCC": "system"}, tmp_path)
    assert nvcc.source == "system" and nvcc.release == "12.8" and nvcc.reason == "AMPREPRO_NVCC=system"


def test_a_bad_force_value_is_refused(torch13, tmp_path):
    with pytest.raises(ApexError, match=r"AMPREPRO_NVCC='conda' is not one of system, pip"):
        choose({**torch13, "AMPREPRO_NVCC": "conda"}, tmp_path)


def test_a_failed_install_names_the_offline_fix_and_leaves_nothing(torch13, tmp_path):
    with pytest.raises(ApexError) as error:
        choose({**torch13, "PIP_FIND_LINKS": str(tmp_path / "nothing")}, tmp_path)
    assert "installing nvcc from pip failed" in str(error.value) and "PIP_FIND_LINKS" in str(error.value)
    assert list((tmp_path / "venv" / "amprepro-cuda").iterdir()) == [tmp_path / "venv" / "amprepro-cuda" / ".lock"]


def test_a_pip_nvcc_of_another_release_is_refused(torch13, tmp_path):
    wrong = fake_cuda_wheels(tmp_path / "wrong", REQUIREMENTS, release="13.1")
    with pytest.raises(ApexError, match="reports release 13.1, not torch's 13.0"):
        choose(offline(torch13, wrong), tmp_path)
    assert not [p for p in (tmp_path / "venv" / "amprepro-cuda").iterdir() if p.name != ".lock"]


def test_preflight_passes_with_the_pip_toolkit(torch13, wheels, tmp_path):
    """survey in a fresh interpreter probe + the preflight's compile check, all with the pip nvcc."""
    env = offline(torch13, wheels)
    setup = inspect_setup(STRICT_SETUP, has_amp=False)
    tools = survey(True, env, "9.0", echo=lambda *a, **k: None)
    assert tools.nvcc.source == "pip"
    preflight(tools, setup, CUDA_FLAGS, env)  # raises on a problem


def test_the_committed_requirements_pin_one_release():
    extras, version = cudakit.parse_pin(REQUIREMENTS)
    assert version == "13.0.2" and set(extras) == {"nvcc", "crt", "nvvm", "cudart", "cccl", "profiler"}
    assert cudakit.requirements_file("13.0") == REQUIREMENTS


def test_sanity_names_the_pip_route(bare_env, monkeypatch, tmp_path):
    from amprepro.env import sanity

    class Torch13:
        class version:
            cuda = "13.0"

    monkeypatch.setattr(os, "environ", dict(bare_env))
    version, _ = sanity.toolkit_checks(Torch13, apex_required=True)
    assert version["status"] == "pass" and "nvcc 13.0 from pip (requirements-cuda13.0.txt" in version["detail"]
    monkeypatch.setattr(os, "environ", {**bare_env, "AMPREPRO_NVCC": "system"})
    version, _ = sanity.toolkit_checks(Torch13, apex_required=True)
    assert version["status"] == "fail" and "unset AMPREPRO_NVCC" in version["fix"]


def test_the_fixture_extension_compiled_in_the_pip_route_environment(built):
    """The session's one real compile (conftest.built) ran with the pip route's CUDA_HOME, PATH and CPATH: fake_apex's
    setup.py saw them, and apex_C, a real torch C++ extension, was built and verified. No GPU is needed for it."""
    home = built.env["CUDA_HOME"]
    assert "/venv/amprepro-cuda/13.0.2-" in home and built.env["PATH"].startswith(f"{home}/bin:")
    log = (built.results / "logs" / f"build-{built.key}.log").read_text()
    assert f"fake_apex setup.py environment: CUDA_HOME={home} CPATH={built.env['CPATH']}" in log
    assert built.record["extensions"]["apex_C"] == {"built": True, "importable": True, "error": None}
    assert built.record["verification"]["checks"]["apex_C"]["ok"]


def test_the_plan_hands_the_pip_environment_to_the_build(torch13, wheels, tmp_path):
    nvcc, _ = choose(offline(torch13, wheels), tmp_path)
    setup = inspect_setup(STRICT_SETUP, has_amp=False)
    plan = plan_build(setup, CUDA_FLAGS, 2, None, Toolchain({}, nvcc, None, "9.0", "apex.cuda_arch_list"), {})
    assert plan.env["CUDA_HOME"] == nvcc.cuda_home and plan.env["PATH"] == nvcc.env["PATH"]
    assert plan.env["CPATH"] == nvcc.env["CPATH"] and plan.env["TORCH_CUDA_ARCH_LIST"] == "9.0"


@pytest.mark.skipif(not os.environ.get("AMPREPRO_TEST_CUDA_WHEELS"),
                    reason="needs NVIDIA's real wheels: AMPREPRO_TEST_CUDA_WHEELS=<dir of `pip download -r "
                           "requirements-cuda13.0.txt`> (about 104 MB)")
def test_real_pip_nvcc_compiles_and_links_a_kernel_without_a_gpu(tmp_path):
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": os.environ["AMPREPRO_TEST_CUDA_WHEELS"]}
    home = cudakit.ensure_installed(REQUIREMENTS, "13.0", tmp_path / "venv", env, echo=lambda *a, **k: None)
    (tmp_path / "probe.cu").write_text("#include <cuda_runtime.h>\n#include <cuda_profiler_api.h>\n"
                                       "#include <nv/target>\n__global__ void k() {}\n"
                                       "int main() { k<<<1, 1>>>(); return 0; }\n")
    done = subprocess.run([str(home / "bin" / "nvcc"), "-arch=sm_90", "probe.cu", "-o", "probe", f"-L{home}/lib",
                           "-lcudart"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert cudakit.nvcc_release(str(home / "bin" / "nvcc")) == "13.0"
