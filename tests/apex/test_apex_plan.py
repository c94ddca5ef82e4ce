"""What gets built and how: flags per ref, the pip command, the compute_70 patch, the cache key, log diagnoses."""

from __future__ import annotations

import json
import shlex

import pytest
from apex_fakes import REPO

from amprepro.env.apexbuild import patches
from amprepro.env.apexbuild.build import Progress, diagnose, pip_wheel_command, plan_build
from amprepro.env.apexbuild.setup_inspect import inspect_setup
from amprepro.env.apexbuild.store import cache_key
from amprepro.env.apexbuild.toolchain import Nvcc, Toolchain
from amprepro.env.apexbuild.verify import reusable_gpu_checks

# The parts of apex 25.05's setup.py the builder reads (abridged; same statements and shapes).
SETUP_25_05 = '''
import sys
def check_cuda_torch_binary_vs_bare_metal(cuda_dir):
    if (bare_metal_version != torch_binary_version):
        raise RuntimeError("mismatch")
def get_cuda_bare_metal_version(cuda_dir):
    raw_output = subprocess.check_output([cuda_dir + "/bin/nvcc", "-V"], universal_newlines=True)
_, bare_metal_version = get_cuda_bare_metal_version(CUDA_HOME)
if "--cpp_ext" in sys.argv or "--cuda_ext" in sys.argv:
    if TORCH_MAJOR == 0:
        raise RuntimeError("--cpp_ext requires Pytorch 1.0 or later")
if "--cpp_ext" in sys.argv:
    sys.argv.remove("--cpp_ext")
    ext_modules.append(CppExtension("apex_C", ["csrc/flatten_unflatten.cpp"]))
if "--cuda_ext" in sys.argv:
    sys.argv.remove("--cuda_ext")
    ext_modules.append(CUDAExtension(name="amp_C", sources=["csrc/amp_C_frontend.cpp"]))
    ext_modules.append(CUDAExtension(name="fused_layer_norm_cuda", sources=["csrc/layer_norm_cuda.cpp"]))
    if bare_metal_version >= Version("11.0"):
        cc_flag = []
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_70,code=sm_70")
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_80,code=sm_80")
        ext_modules.append(CUDAExtension(name="fused_weight_gradient_mlp_cuda", sources=["a.cu"]))
if "--xentropy" in sys.argv:
    ext_modules.append(CUDAExtension(name="xentropy_cuda", sources=["x.cu"]))
parallel = None
if "--parallel" in sys.argv:
    idx = sys.argv.index("--parallel")
'''
# 25.09 added environment variables for the same flags.
SETUP_25_09 = SETUP_25_05.replace(
    'if "--cpp_ext" in sys.argv:\n', 'if has_flag("--cpp_ext", "APEX_CPP_EXT"):\n').replace(
    'if "--cuda_ext" in sys.argv:\n', 'if has_flag("--cuda_ext", "APEX_CUDA_EXT"):\n') + '''
ENV_TO_FLAG = {"APEX_CPP_EXT": "--cpp_ext", "APEX_CUDA_EXT": "--cuda_ext", "APEX_XENTROPY": "--xentropy"}
apex_parallel_build = os.environ.get("APEX_PARALLEL_BUILD", None)
'''
CUDA_TOOLS = Toolchain({}, Nvcc("/cuda/bin/nvcc", "/cuda", "CUDA_HOME", "13.0"), None, "9.0", "apex.cuda_arch_list")
KEY_INPUTS = {"apex_commit": "379937e1" + "0" * 32, "torch": "2.11.0+cu130", "torch_git": "abc", "torch_cuda": "13.0",
              "cuda": "13.0", "python": "cpython-312-x86_64-linux-gnu", "arch_list": "9.0",
              "flags": ["--cpp_ext", "--cuda_ext"]}


def test_25_05_flags_and_the_extensions_they_promise():
    setup = inspect_setup(SETUP_25_05, has_amp=True)
    assert setup.core_flags() == ["--cpp_ext", "--cuda_ext"]
    assert setup.promised(setup.core_flags()) == {"apex_C": "cpp", "amp_C": "cuda", "fused_layer_norm_cuda": "cuda",
                                                  "fused_weight_gradient_mlp_cuda": "cuda"}
    assert setup.needs_cuda(["--cuda_ext"]) and not setup.needs_cuda(["--cpp_ext"])
    assert (setup.strict_cuda_check, setup.parallel_option, setup.compute_70_gencodes) == (True, True, 1)
    assert setup.env_vars == {} and not setup.parallel_env
    assert setup.nvcc_at_import  # so its shell (no flags) needs an nvcc as well


def test_a_setup_py_that_runs_nvcc_only_for_its_extensions_lets_the_shell_build_without_one():
    text = SETUP_25_05.replace("_, bare_metal_version = get_cuda_bare_metal_version(CUDA_HOME)\n", "")
    assert not inspect_setup(text, has_amp=True).nvcc_at_import
    assert not inspect_setup((REPO / "tests/fixtures/fake_apex/setup.py").read_text(), has_amp=False).nvcc_at_import


def test_25_09_also_takes_environment_variables():
    setup = inspect_setup(SETUP_25_09, has_amp=False)
    assert setup.core_flags() == ["--cpp_ext", "--cuda_ext"]
    assert setup.env_vars["--cuda_ext"] == "APEX_CUDA_EXT" and setup.parallel_env


def test_25_05_build_passes_flags_only_through_config_settings():
    setup = inspect_setup(SETUP_25_05, has_amp=True)
    plan = plan_build(setup, setup.core_flags(), jobs=16, build_jobs=None, tools=CUDA_TOOLS, env={})
    assert plan.options == ["--cpp_ext", "--cuda_ext", "--parallel", "4"]
    assert plan.env == {"MAX_JOBS": "4", "TORCH_CUDA_ARCH_LIST": "9.0", "CUDA_HOME": "/cuda"}
    command = pip_wheel_command(plan, "src", "dist")
    assert "--no-build-isolation" in command
    assert [arg for arg in command if arg.startswith("--config-settings")] == [
        "--config-settings=--build-option=--cpp_ext --cuda_ext --parallel 4"]
    # setuptools shlex-splits this one string into the argv setup.py looks for
    assert shlex.split(command[-2].split("=", 2)[2]) == ["--cpp_ext", "--cuda_ext", "--parallel", "4"]


def test_25_09_build_also_sets_the_apex_variables():
    setup = inspect_setup(SETUP_25_09, has_amp=False)
    plan = plan_build(setup, setup.core_flags(), jobs=16, build_jobs=2, tools=CUDA_TOOLS, env={})
    assert plan.env["APEX_CPP_EXT"] == plan.env["APEX_CUDA_EXT"] == "1"
    assert plan.env["APEX_PARALLEL_BUILD"] == "2" and plan.parallel == 2
    assert "APEX_XENTROPY" not in plan.env


def test_a_users_max_jobs_is_kept():
    setup = inspect_setup(SETUP_25_05, has_amp=True)
    assert plan_build(setup, setup.core_flags(), 16, None, CUDA_TOOLS, {"MAX_JOBS": "1"}).max_jobs == 1


def test_cpu_only_source_gets_no_cuda_settings():
    setup = inspect_setup(SETUP_25_05, has_amp=True)
    plan = plan_build(setup, ["--cpp_ext"], jobs=2, build_jobs=None, tools=Toolchain({}, None, None, None, ""), env={})
    assert plan.options == ["--cpp_ext"] and "TORCH_CUDA_ARCH_LIST" not in plan.env


def test_compute_70_patch_only_with_cuda_13(tmp_path):
    setup = inspect_setup(SETUP_25_05, has_amp=True)
    assert patches.planned(setup, "12.8") == []
    assert patches.planned(setup, "13.0") == ["drop-compute_70"]
    (tmp_path / "setup.py").write_text(SETUP_25_05)
    [record] = patches.apply(["drop-compute_70"], tmp_path)
    patched = (tmp_path / "setup.py").read_text()
    assert "compute_70" not in patched and 'cc_flag.append("arch=compute_80,code=sm_80")' in patched
    assert record["removed_gencodes"] == 1 and "-        cc_flag.append(\"arch=compute_70" in record["diff"]
    assert inspect_setup(patched, has_amp=True).promised(["--cuda_ext"]) == setup.promised(["--cuda_ext"])


def test_cache_key_is_stable_and_changes_with_every_input():
    key = cache_key(KEY_INPUTS)
    assert cache_key(dict(reversed(KEY_INPUTS.items()))) == key
    for name, other in [("apex_commit", "e74a67bb" + "0" * 32), ("torch", "2.12.0+cu130"), ("torch_cuda", "12.8"),
                        ("cuda", "13.1"), ("python", "cpython-311-x86_64-linux-gnu"), ("arch_list", "8.0;9.0"),
                        ("flags", ["--cpp_ext"])]:
        assert cache_key({**KEY_INPUTS, name: other}) != key, name


@pytest.mark.parametrize("log, expected", [
    ("nvcc fatal   : Unsupported gpu architecture 'compute_70'", "nvcc does not support compute_70"),
    ("g++: fatal error: Killed signal terminated program cc1plus", "ran out of memory"),
    ("csrc/x.cpp:1:10: fatal error: cuda_runtime.h: No such file or directory", "CUDA headers are missing"),
    ("ModuleNotFoundError: No module named 'torch'", "could not import torch"),
    ("error: option --parallel 12 not recognized", "did not consume the option --parallel"),
])
def test_build_failures_are_explained(log, expected):
    assert expected in diagnose(log)


def test_gpu_checks_are_reused_only_for_the_same_wheel_and_gpu(tmp_path):
    record = {"wheel_sha256": "w1", "gpu_identity": "H200 | GPU-1 | 580", "gpu": "NVIDIA H200",
              "verified_at": "2026-11-29T20:46:00+00:00", "checks": {"fused_adam": {"ok": True}}}
    (tmp_path / ".amprepro-verification.json").write_text(json.dumps(record))
    reused = reusable_gpu_checks(tmp_path, "w1", "H200 | GPU-1 | 580", {})
    assert reused["checks"]["fused_adam"] == {"ok": True, "reused": True}
    assert reusable_gpu_checks(tmp_path, "w2", "H200 | GPU-1 | 580", {}) is None
    assert reusable_gpu_checks(tmp_path, "w1", "H100 | GPU-2 | 580", {}) is None
    assert reusable_gpu_checks(tmp_path, "w1", "H200 | GPU-1 | 580", {"AMPREPRO_APEX_REVERIFY": "1"}) is None


def test_progress_reports_starts_links_and_a_heartbeat():
    """Line shapes from the H200 build log of 25.05."""
    said = []
    progress = Progress(["amp_C", "syncbn"], start=0.0, echo=lambda text, **_: said.append(text))
    temp = "/tmp/x/src/build/temp.linux-x86_64-cpython-312"
    for line in ["  building 'amp_C' extension", "  building 'syncbn' extension",
                 f"  [3/15] /usr/local/cuda/bin/nvcc -MD -MF {temp}/amp_C/csrc/multi_tensor_adam.o.d -c x.cu",
                 f"  [2/2] /usr/local/cuda/bin/nvcc -MD -MF {temp}/syncbn/csrc/welford.o.d -c y.cu",
                 "  g++ -shared a.o -o build/lib.linux-x86_64-cpython-312/syncbn.cpython-312-x86_64-linux-gnu.so"]:
        progress.see(line)
    progress.next_beat = 0.0
    progress.beat_if_due("last")
    assert [text.split(" s  ", 1)[1] for text in said] == [
        "compiling amp_C (1/2 started)", "compiling syncbn (2/2 started)", "linked syncbn (1/2 done)",
        "still building: 1/2 extensions linked, ninja steps 5/17 of those started; last line: last"]
