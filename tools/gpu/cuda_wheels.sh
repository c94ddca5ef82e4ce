#!/bin/bash
# Fetch, here (PyPI reachable), the wheels of requirements-cuda13.0.txt for the GPU box (x86-64, no network), in three
# folders that each fit in one device call with the working tree (64 MiB a call, the tree included: 15.5 MB on
# 2026-12-01). nvvm's wheel (61.6 MB) alone would fill a call, so it is split in 18 MB parts;
# tools/gpu/pip_nvcc_run.sh joins them there and checks the sha256 recorded here:
#   .whl-cuda/a/  nvcc (37 MB)
#   .whl-cuda/b/  nvvm parts 1-2 (36 MB)
#   .whl-cuda/c/  cuda-toolkit (meta), crt, cudart, cccl, profiler-api (5.5 MB) + nvvm parts 3-4 (26 MB)
#
#   bash tools/gpu/cuda_wheels.sh            # then see tools/gpu/pip_nvcc_run.sh for the calls
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl-cuda && mkdir -p .whl-cuda/a .whl-cuda/b .whl-cuda/c .whl-cuda/all
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 -d .whl-cuda/all -r requirements-cuda13.0.txt \
  2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
mv .whl-cuda/all/nvidia_cuda_nvcc-*.whl .whl-cuda/a/
nvvm=$(ls .whl-cuda/all/nvidia_nvvm-*.whl)
name=$(basename "$nvvm")
sha256sum "$nvvm" | sed "s|  .*|  $name|" | tee .whl-cuda/b/"$name".sha256 > .whl-cuda/c/"$name".sha256
split -b 18000000 -d "$nvvm" .whl-cuda/all/"$name".part-
mv .whl-cuda/all/"$name".part-0[01] .whl-cuda/b/
mv .whl-cuda/all/"$name".part-* .whl-cuda/c/
rm "$nvvm"
mv .whl-cuda/all/*.whl .whl-cuda/c/
rmdir .whl-cuda/all
ls -la .whl-cuda/a .whl-cuda/b .whl-cuda/c
du -sb .whl-cuda/a .whl-cuda/b .whl-cuda/c
