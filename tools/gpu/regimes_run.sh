#!/bin/bash
# The memory regimes one H200 can run (issue 25; amprepro.analysis.regimes' rows with gpu=True), each cell in its own
# process, through tools/gpu/regimes_run.py. One device call on nvidia-h200, about 4 minutes, under 9:
#
#   here, once:  bash tools/gpu/regimes_run.sh wheel      # .whl-peft/peft-0.21.2-py3-none-any.whl (git-ignored)
#   device call: carry [".whl-peft"], command  OUT=$OUT bash tools/gpu/regimes_run.sh run
#
# Uses the box's python3 (torch 2.11+cu130, transformers and accelerate, which peft imports) with workflow/ on the
# path; peft comes from the carried wheel (--no-deps: its dependencies are the box's), or the box's own when none is
# carried. Writes $OUT/regimes/<gpu-slug>.json (the measurement file: commit it as results-reference/regimes/) and
# $OUT/regimes/cells.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
PEFT=peft==0.21.2
case "${1:-}" in
  wheel)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      -d .whl-peft "$PEFT"
    ls -l .whl-peft
    ;;
  run)
    OUT=${OUT:?set OUT to the folder that comes back}
    budget=${2:-500}
    [[ $budget =~ ^[0-9]+$ ]] || { echo "regimes_run.sh: the budget is whole seconds, not '$budget'" >&2; exit 2; }
    site=/tmp/amprepro-regimes-site
    if compgen -G ".whl-peft/peft-*.whl" > /dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .whl-peft/peft-*.whl
      export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    mkdir -p "$OUT/regimes"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/regimes/gpu.txt"
    python3 -c 'import torch, peft; print("torch", torch.__version__, "peft", peft.__version__, peft.__file__)' \
      || echo "regimes_run.sh: peft does not import here: the LoRA cells will record the error, the others run" 
    timeout $((budget + 40)) python3 tools/gpu/regimes_run.py run --out "$OUT/regimes" --budget-s "$budget"
    ;;
  *)
    echo "usage: bash tools/gpu/regimes_run.sh wheel | OUT=DIR bash tools/gpu/regimes_run.sh run [budget-seconds]" >&2
    exit 2
    ;;
esac
