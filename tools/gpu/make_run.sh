#!/bin/bash
# A reviewer's route on a GPU box that has CUDA torch but no network: the README's `make run`, then `make verify`,
# timed from the first call's start to the verdict. What differs from a networked box, and only that: the venv sees
# the box's own CUDA torch (as "install the CUDA build of torch first" gives) and gets the rest from the carried
# wheels in .whl/, and apex comes from a local export (docs/apex.md: "Apex on a machine without GitHub").
# A device call is cut at 10 minutes: call the script again and `make run` resumes where the cut left it.
#
#   bash tools/gpu/wheels.sh                                   # here, once: the wheels (.whl/)
#   OUT=/path/to/outdir tools/gpu/make_run.sh [seconds] [verify]   # there, carrying .whl and vendor/apex-25.05*
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a directory for the results}
budget=${1:-560}
deadline=$((SECONDS + budget))
mode=${2:-}
venv=${AMPREPRO_VENV:-/tmp/amprepro-venv}
mkdir -p "$OUT"
source tools/gpu/venv.sh || exit 1
bash tools/gpu/apex_config.sh > /tmp/amprepro-gpu.yaml || exit 1
started=${AMPREPRO_GPU_STATE:-/tmp}/amprepro-started-$(echo "$PWD" | md5sum | cut -c1-8)
[ -f "$started" ] || date +%s > "$started"
args=(VENV="$venv" SNAKEMAKE_ARGS="--configfile config/config.yaml /tmp/amprepro-gpu.yaml")
echo "make run in $PWD, $(($(date +%s) - $(cat "$started"))) s after the first call's start"
timeout -k 20 $((deadline - SECONDS - 45)) make run "${args[@]}" > "$OUT/make-run.log" 2>&1
rc=$?
echo "make run rc=$rc; $(($(date +%s) - $(cat "$started"))) s since the first call's start"
grep -E "^(amprepro|another run)|steps \(|Error in rule|Nothing to be done" "$OUT/make-run.log" | tail -n 8
if [ "$rc" = 0 ] && [ "$mode" = verify ]; then
  make verify "${args[@]}" > "$OUT/make-verify.log" 2>&1
  echo "make verify rc=$?; verdict $(($(date +%s) - $(cat "$started"))) s after the first call's start"
  tail -n 25 "$OUT/make-verify.log"
fi
tar czf "$OUT/results.tgz" results/summary results/apex/*.json results/apex/logs results/peak results/sanity \
  results/environment results/runs results/logs results/verify results/plan results/largest_batch \
  results/report/report.html 2>/dev/null
cp "$started" "$OUT/started-epoch.txt"
ls -la "$OUT"
