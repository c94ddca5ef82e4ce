#!/bin/bash
# The paper preset through the README's `make run` + `make verify` under emulated smaller cards (issue 21): for each
# cap in CAPS (GiB, or "none" for the card itself), gpu_memory_limit_gib=<cap> on the command line, then the results
# that matter packed as $OUT/cap-<cap>.tgz. Apex is built by the first run and reused from its cache by the others.
# Same box setup as tools/gpu/make_run.sh (carried wheels in .whl/, apex export in vendor/apex-25.05).
#
#   OUT=/path/to/outdir CAPS="none 12" tools/gpu/caps_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a directory for the results}
venv=${AMPREPRO_VENV:-/tmp/amprepro-venv}
mkdir -p "$OUT"
source tools/gpu/venv.sh || exit 1
bash tools/gpu/apex_config.sh > /tmp/amprepro-gpu.yaml || exit 1
deadline=$((SECONDS + ${BUDGET:-570}))
for cap in ${CAPS:?set CAPS, e.g. "none 12 16"}; do
  if [ -f "$OUT/../done-$cap" ] || [ -f "/tmp/done-$cap" ]; then continue; fi
  if [ $((deadline - SECONDS)) -lt "${NEED:-240}" ]; then echo "cap $cap: not started, $((deadline - SECONDS))s left: call again"; break; fi
  extra=""
  [ "$cap" = none ] || extra="--config gpu_memory_limit_gib=$cap"
  args=(VENV="$venv" SNAKEMAKE_ARGS="--configfile config/config.yaml /tmp/amprepro-gpu.yaml $extra")
  start=$(date +%s)
  make run "${args[@]}" > "$OUT/make-run-$cap.log" 2>&1
  rc=$?
  ran=$(($(date +%s) - start))
  make verify "${args[@]}" > "$OUT/make-verify-$cap.log" 2>&1
  vrc=$?
  total=$(($(date +%s) - start))
  echo "cap $cap: make run rc=$rc in ${ran}s; make verify rc=$vrc; ${total}s to the verdict" | tee "$OUT/timing-$cap.txt"
  grep -E "^plan: " results/logs/plan.log | tail -n 12
  grep -E "^verify: |^  [a-z0-9-]+: " "$OUT/make-verify-$cap.log" | head -n 14
  mkdir -p "/tmp/cap-$cap"
  cp -r results/summary results/verify results/plan results/largest_batch results/report/report.html results/logs/plan.log \
    "$OUT/make-run-$cap.log" "$OUT/make-verify-$cap.log" "$OUT/timing-$cap.txt" "/tmp/cap-$cap/" 2>/dev/null
  python3 tools/gpu/job_seconds.py "$OUT/make-run-$cap.log" > "/tmp/cap-$cap/job-seconds.txt" 2>&1
  tar czf "$OUT/cap-$cap.tgz" -C /tmp "cap-$cap"
  [ "$rc" = 0 ] && touch "/tmp/done-$cap"
  rm -f "$OUT/make-run-$cap.log" "$OUT/make-verify-$cap.log" "$OUT/timing-$cap.txt"
done
ls -la "$OUT"
