#!/bin/bash
# Fetch, here (PyPI reachable), the wheels of requirements-cuda13.0.txt for the GPU box (x86-64, no network), split in
# two folders that each fit in one device call (64 MiB a call, working tree included):
#   .whl-cuda/a/  cuda-toolkit (meta), nvcc, crt, cudart, cccl, profiler-api   (about 43 MB)
#   .whl-cuda/b/  nvvm                                                          (about 62 MB)
#
#   bash tools/gpu/cuda_wheels.sh            # then see tools/gpu/pip_nvcc_run.sh for the calls
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl-cuda && mkdir -p .whl-cuda/a .whl-cuda/b
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 -d .whl-cuda/a -r requirements-cuda13.0.txt
mv .whl-cuda/a/nvidia_nvvm-*.whl .whl-cuda/b/
ls -la .whl-cuda/a .whl-cuda/b
du -sb .whl-cuda/a .whl-cuda/b
