#!/bin/bash
# The accuracy preset (issue 24: does AMP change what a model learns?) on a GPU box without network, in one call:
# `make run` with preset=accuracy in its own working directory ($ACCURACY_DIR, default /tmp/amprepro-accuracy), so a
# paper run's results/ in this checkout are never touched; then the convergence verdicts and the claims, and the
# results packed under $OUT. Same box setup as tools/gpu/make_run.sh: the venv from the carried wheels in .whl/
# (tools/gpu/venv.sh), apex from the local export vendor/apex-25.05 (apex_o1 is the accuracy claim's variant, apex_o2 and apex_o3 the opt-level claims').
# A call cut short by its budget is resumed by calling the script again (make run continues where it stopped).
#
#   bash tools/gpu/wheels.sh                                  # here, once: the wheels (.whl/)
#   OUT=/path/to/outdir tools/gpu/accuracy_run.sh [seconds]  # there, carrying .whl and vendor/apex-25.05
#
# Writes $OUT/make-run.log, $OUT/convergence.txt (each precision's final held-out loss, mean ± sd over seeds, and
# its paired gap against FP32 with the verdicts), $OUT/claims.txt, $OUT/timing.txt and $OUT/accuracy-results.tgz (summary, runs, logs, report.html).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a directory for the results}
budget=${1:-530}
deadline=$((SECONDS + budget))
venv=${AMPREPRO_VENV:-/tmp/amprepro-venv}
work=${ACCURACY_DIR:-/tmp/amprepro-accuracy}
repo=$PWD
apex_source=$(realpath -m "${APEX_SOURCE:-vendor/apex-25.05}")
mkdir -p "$OUT" "$work"
[ -d "$apex_source" ] || echo "warning: no apex source at $apex_source: the apex_o1 cells will be skipped, with the reason"
source tools/gpu/venv.sh || exit 1
{ echo "preset: accuracy"; bash tools/gpu/apex_config.sh "$apex_source"; } > "$work/accuracy.yaml" || exit 1
args=(VENV="$venv" SNAKEMAKE_ARGS="--directory $work --configfile $repo/config/config.yaml $work/accuracy.yaml")
start=$(date +%s)
timeout -k 20 $((deadline - SECONDS - 40)) make run "${args[@]}" > "$OUT/make-run.log" 2>&1
rc=$?
echo "make run (preset accuracy) rc=$rc in $(($(date +%s) - start)) s" | tee "$OUT/timing.txt"
grep -E "^(amprepro|another run)|Error in rule|Nothing to be done|steps \(" "$OUT/make-run.log" | tail -n 8
results=$work/results
if [ -f "$results/summary/summary.json" ]; then
  PYTHONPATH=$repo/workflow "$venv/bin/python" -m amprepro.analysis.convergence --summary "$results/summary/summary.json" \
    | tee "$OUT/convergence.txt"
  PYTHONPATH=$repo/workflow "$venv/bin/python" -m amprepro.analysis.claims --claims "$repo/config/claims.yaml" \
    --summary "$results/summary/summary.json" --sanity "$results/sanity/sanity.json" --runs-dir "$results/runs" \
    > "$OUT/claims.txt" 2>&1
  grep -E "^(vit-apex-o1-accuracy|apex-o2-may-be-unstable|apex-o3-not-for-training):" "$OUT/claims.txt"
else
  echo "no summary yet (rc=$rc): call the script again to continue"
fi
tar czf "$OUT/accuracy-results.tgz" -C "$work" results/summary results/runs results/logs results/environment \
  results/sanity results/peak results/apex/apex.json results/report/report.html accuracy.yaml 2>/dev/null
ls -la "$OUT"
