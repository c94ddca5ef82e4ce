#!/bin/bash
# Run the paper preset through the pipeline on a GPU box that has torch + CUDA but not Snakemake, then pack the
# results for `python -m amprepro.verify.verify promote`. This is how reference/nvidia-h200 is meant to be produced.
#
#   OUT=/path/to/outdir tools/gpu/paper_run.sh [seconds] [extra-config.yaml]
#
# Wheels for Snakemake and its dependencies may be given in .whl/ (the box may have no network); they are installed
# into /tmp/amprepro-site. Apex comes from a local export (docs/apex.md): set APEX_SOURCE (default vendor/apex-25.05).
set -uo pipefail
export PYTHONUNBUFFERED=1
budget=${1:-540}  # seconds for the whole script, packing included
deadline=$((SECONDS + budget))
extra=${2:-}
OUT=${OUT:?set OUT to a directory for the results}
mkdir -p "$OUT" /tmp/amprepro-bin
if compgen -G ".whl/*.whl" > /dev/null; then
  # Compiled once here: without bytecode every Snakemake start took ~9 s on the H200 box.
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/amprepro-site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/amprepro-site
fi
# The rules call `python`. A wrapper, not a symlink: a symlinked venv interpreter loses its venv.
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/amprepro-bin/python
chmod +x /tmp/amprepro-bin/python
export PATH=/tmp/amprepro-bin:$PATH
# Fail fast and loudly: a device call once spent its whole budget in a Snakemake that printed nothing.
timeout 60 python -c 'import torch, snakemake; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' \
  || { echo "python lacks torch or snakemake (or hangs importing them)"; exit 1; }
timeout 120 python -m snakemake results/summary/summary.json -n --quiet rules --configfile config/config.yaml \
  > "$OUT/dry-run.log" 2>&1 || { echo "dry run failed:"; tail -n 20 "$OUT/dry-run.log"; exit 1; }
{ echo "preset: ${PRESET:-paper}"; bash tools/gpu/apex_config.sh; } > /tmp/amprepro-gpu.yaml || exit 1
configs=(config/config.yaml /tmp/amprepro-gpu.yaml ${extra:+"$extra"})
# The acceptance's host has 16 cores: build apex with 16 threads on bigger boxes, leaving the rest to the cells.
threads=(); [ "$(nproc)" -gt 16 ] && threads=(--set-threads apex=16)
# A device call killed at its time limit does not kill this script's Snakemake (`timeout` gives it a process group
# of its own): it goes on running in this directory, holding the lock, and the next call's Snakemake cannot start.
# Stop what an earlier call left here (only processes whose working directory is this one), then unlock;
# --rerun-incomplete redoes the jobs it was running.
leftovers() {
  local pid
  for pid in $(pgrep -f "snakemake results/summary|amprepro\.(gpuslots|train)"); do
    [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$PWD" ] && echo "$pid"
  done
}
if [ -n "$(leftovers)" ]; then
  echo "stopping what an earlier call left running here: $(leftovers | tr '\n' ' ')"
  kill -TERM $(leftovers) 2>/dev/null
  for _ in $(seq 30); do [ -z "$(leftovers)" ] && break; sleep 1; done
  [ -n "$(leftovers)" ] && kill -KILL $(leftovers) 2>/dev/null
  sleep 1
fi
python -m snakemake --unlock --configfile "${configs[@]}" > /dev/null 2>&1
start=$SECONDS
# One GPU job per GPU (--resources gpu=<GPUs>, amprepro.gpuslots gives each its own): timed cells never share one.
# Snakemake has once outlived its TERM by 40 s (the call was killed first): KILL it 30 s after.
timeout -k 30 -s TERM $((deadline - SECONDS - 50)) python -m snakemake results/summary/summary.json --cores "$(nproc)" --resources gpu="$(nvidia-smi -L | grep -c ^GPU)" --rerun-incomplete \
  "${threads[@]}" --keep-going --configfile "${configs[@]}" > "$OUT/snakemake.log" 2>&1
echo "snakemake rc=$? after $((SECONDS - start)) s"
grep -E "steps \(|Error in rule|Nothing to be done" "$OUT/snakemake.log" | tail -n 5
tar czf "$OUT/results.tgz" results/summary results/apex/*.json results/apex/logs results/peak results/sanity results/environment \
  results/runs results/logs 2>/dev/null
ls -la "$OUT"
