"""Every preflight diagnosis, each provoked for real (scripts on PATH, tmp toolkits, packages on PYTHONPATH)."""

from __future__ import annotations

import pytest
from apex_fakes import fake_cuda, fake_distribution, fake_nvidia_smi, fake_python_packages, python_env, write_script

from amprepro.env.apexbuild import ApexError
from amprepro.env.apexbuild.preflight import preflight
from amprepro.env.apexbuild.setup_inspect import inspect_setup
from amprepro.env.apexbuild.toolchain import survey

# The shape of apex 25.05's setup.py that matters here: flags on sys.argv and the strict CUDA version check.
STRICT_SETUP = '''
import sys
def check_cuda_torch_binary_vs_bare_metal(cuda_dir):
    if (bare_metal_version != torch_binary_version):
        raise RuntimeError("Cuda extensions are being compiled with a version of Cuda that does not match")
if "--cpp_ext" in sys.argv:
    ext_modules.append(CppExtension("apex_C", ["csrc/flatten_unflatten.cpp"]))
if "--cuda_ext" in sys.argv:
    ext_modules.append(CUDAExtension(name="amp_C", sources=["csrc/amp_C_frontend.cpp"]))
'''
LENIENT_SETUP = STRICT_SETUP.replace("bare_metal_version != torch_binary_version", "False")
CUDA_FLAGS = ["--cpp_ext", "--cuda_ext"]


def problems(env: dict, setup_text: str = STRICT_SETUP, arch: str | None = "9.0") -> str:
    """The preflight's message, or '' when it passes."""
    setup = inspect_setup(setup_text, has_amp=False)
    tools = survey(setup.needs_cuda(CUDA_FLAGS), env, arch)
    try:
        preflight(tools, setup, CUDA_FLAGS, env)
    except ApexError as exc:
        return str(exc)
    return ""


@pytest.fixture
def cuda_env(bare_env, tmp_path) -> dict:
    """A complete fake CUDA setup that passes: CUDA torch 13.0, nvcc 13.0 with headers, ninja."""
    home = fake_cuda(tmp_path / "cuda")
    return python_env({**bare_env, "CUDA_HOME": str(home)}, fake_python_packages(tmp_path / "py"))


def test_a_complete_toolchain_passes(cuda_env):
    assert problems(cuda_env) == ""


def test_nvcc_not_found_anywhere(bare_env, tmp_path):
    """With the system route forced; by default the pip route takes over (test_apex_cudakit.py)."""
    env = python_env({**bare_env, "AMPREPRO_NVCC": "system"}, fake_python_packages(tmp_path / "py"))
    message = problems(env)
    assert "nvcc (the CUDA compiler) was not found" in message
    assert "install nvcc 13.0 from pip" in message and "requirements-cuda13.0.txt" in message


def test_nvcc_of_an_activated_conda_env_is_found(bare_env, tmp_path):
    prefix = fake_cuda(tmp_path / "env")
    env = python_env({**bare_env, "CONDA_PREFIX": str(prefix)}, fake_python_packages(tmp_path / "py"))
    tools = survey(True, env, "9.0")
    assert tools.nvcc.found_via.startswith("CONDA_PREFIX") and tools.nvcc.release == "13.0"
    assert problems(env) == ""


def test_nvcc_on_path_is_found(bare_env, tmp_path):
    home = fake_cuda(tmp_path / "toolkit")
    env = python_env({**bare_env, "PATH": f"{home / 'bin'}:{bare_env['PATH']}"}, fake_python_packages(tmp_path / "py"))
    assert survey(True, env, "9.0").nvcc.found_via == "PATH"


def test_cuda_home_without_nvcc(cuda_env, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "has no bin/nvcc" in problems({**cuda_env, "CUDA_HOME": str(tmp_path / "empty")})


def test_nvcc_release_must_equal_torch_cuda_for_a_strict_ref(cuda_env, tmp_path):
    home = fake_cuda(tmp_path / "cuda128", release="12.8")
    message = problems({**cuda_env, "CUDA_HOME": str(home), "AMPREPRO_NVCC": "system"})
    assert "nvcc 12.8" in message and "must equal the CUDA torch was built with (13.0)" in message
    assert "unset AMPREPRO_NVCC" in message and "requirements-cuda13.0.txt" in message


def test_a_lenient_ref_accepts_a_minor_mismatch_but_not_a_major_one(cuda_env, tmp_path):
    minor = fake_cuda(tmp_path / "cuda131", release="13.1")
    major = fake_cuda(tmp_path / "cuda128", release="12.8")
    system = {**cuda_env, "AMPREPRO_NVCC": "system"}  # by default a mismatch takes the pip route
    assert problems({**system, "CUDA_HOME": str(minor)}, LENIENT_SETUP) == ""
    assert "same major version" in problems({**system, "CUDA_HOME": str(major)}, LENIENT_SETUP)


def test_cuda_runtime_header_missing(cuda_env, tmp_path):
    home = fake_cuda(tmp_path / "noheaders", headers=False)
    assert "cuda_runtime.h is missing" in problems({**cuda_env, "CUDA_HOME": str(home)})


def test_host_compiler_rejected_by_nvcc(cuda_env, tmp_path):
    error = "error -- unsupported GNU version! gcc versions later than 12 are not supported!"
    home = fake_cuda(tmp_path / "picky", compile_error=error)
    message = problems({**cuda_env, "CUDA_HOME": str(home)})
    assert "nvcc rejects the host compiler" in message and "unsupported GNU version" in message


def test_torch_cpu_only(bare_env, tmp_path):
    home = fake_cuda(tmp_path / "cuda")
    env = python_env({**bare_env, "CUDA_HOME": str(home)}, fake_python_packages(tmp_path / "py", torch_cuda=None))
    assert "is a CPU-only build" in problems(env)


def test_torch_not_importable(cuda_env, tmp_path):
    broken = fake_python_packages(tmp_path / "broken", torch_import_error="libcudart.so.13: cannot open shared object")
    assert "torch is not importable" in problems(python_env(cuda_env, broken))


def test_cpp_extension_not_importable(bare_env, tmp_path):
    """Real torch, but torch.utils.cpp_extension needs setuptools, which is broken here."""
    (tmp_path / "shadow" / "setuptools").mkdir(parents=True)
    (tmp_path / "shadow" / "setuptools" / "__init__.py").write_text("raise ImportError('setuptools is broken')\n")
    message = problems(python_env(bare_env, tmp_path / "shadow"), arch=None)
    assert "torch.utils.cpp_extension cannot be imported" in message and "setuptools is broken" in message


def test_ninja_missing(cuda_env, tmp_path):
    no_ninja = fake_python_packages(tmp_path / "noninja", ninja=False)
    assert "ninja is not available" in problems(python_env(cuda_env, no_ninja))


def test_ninja_missing_with_real_torch(bare_env, tmp_path):
    """The real torch.utils.cpp_extension looks for `ninja` on PATH; give it a PATH without one."""
    env = {**bare_env, "PATH": str(tmp_path / "bin")}
    assert "ninja is not available" in problems(env, arch=None)


def test_no_cxx_compiler(cuda_env):
    assert "no C++ compiler" in problems({**cuda_env, "CXX": "/nonexistent/g++"})


def test_old_pip(cuda_env, tmp_path):
    old = fake_distribution(tmp_path / "oldpip", "pip", "22.0", "The PyPA recommended tool")
    env = python_env(cuda_env, old, *cuda_env["PYTHONPATH"].split(":"))
    assert "pip 22.0 is older than 23.1" in problems(env)


def test_imposter_apex_from_pypi(cuda_env, tmp_path):
    imposter = fake_distribution(tmp_path / "imposter", "apex", "0.9.10.dev0", "Pyramid toolkit")
    message = problems(python_env(cuda_env, imposter, *cuda_env["PYTHONPATH"].split(":")))
    assert "unrelated PyPI package 'apex' 0.9.10.dev0" in message and "pip uninstall apex" in message


def test_an_installed_nvidia_apex_is_not_an_imposter(cuda_env, tmp_path):
    nvidia = fake_distribution(tmp_path / "nvidia", "apex", "0.1", "PyTorch Extensions written by NVIDIA")
    assert problems(python_env(cuda_env, nvidia, *cuda_env["PYTHONPATH"].split(":"))) == ""


def test_no_gpu_and_no_configured_arch(cuda_env):
    message = problems(cuda_env, arch=None)
    assert "no GPU architecture to compile for" in message and "apex.cuda_arch_list" in message


def test_gpu_arch_detected_with_nvidia_smi(cuda_env, tmp_path):
    fake_nvidia_smi(tmp_path / "bin", ["9.0", "9.0"])
    tools = survey(True, cuda_env, None)
    assert (tools.arch_list, tools.arch_source) == ("9.0", "detected with nvidia-smi")
    assert problems(cuda_env, arch=None) == ""


def test_arch_the_nvcc_cannot_target(cuda_env):
    assert "cannot compile for 7.0" in problems(cuda_env, arch="7.0;9.0")


def test_every_problem_is_reported_at_once(bare_env, tmp_path):
    env = python_env({**bare_env, "CXX": "/nonexistent/g++", "AMPREPRO_NVCC": "system"},
                     fake_python_packages(tmp_path / "py", ninja=False))
    message = problems(env, arch=None)
    assert "4 problem(s)" in message
    for cause in ("ninja is not available", "no C++ compiler", "nvcc (the CUDA compiler) was not found",
                  "no GPU architecture"):
        assert cause in message


def test_nvcc_that_does_not_run(cuda_env, tmp_path):
    write_script(tmp_path / "broken" / "bin" / "nvcc", "exit 3\n")
    assert "does not run or print a release" in problems({**cuda_env, "CUDA_HOME": str(tmp_path / "broken")})
