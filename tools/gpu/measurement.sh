#!/bin/bash
# The GPU measurement checks (tests/gpu/test_measurement.py: CUDA-event step time against a synchronised wall clock,
# the allocator peak against a known allocation, the measured matmul peak against the card's datasheet band), on a
# GPU box with the carried wheels (.whl/, tools/gpu/wheels.sh). One device call, about a minute:
#
#   OUT=$OUT bash tools/gpu/measurement.sh
#
# Writes $OUT/pytest-measurement.log; exits with pytest's status.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the folder that comes back}
venv=${venv:-/tmp/amprepro-venv}
source tools/gpu/venv.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONPATH=workflow:tests timeout 300 "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs -s \
  tests/gpu/test_measurement.py tests/gpu/test_batchsearch_gpu.py tests/backbone/test_measure.py > "$OUT/pytest-measurement.log" 2>&1
rc=$?
tail -n 25 "$OUT/pytest-measurement.log"
exit $rc
