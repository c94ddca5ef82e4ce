#!/bin/bash
# One preset (default: full, every verdict from one command) through the README's `make run`, then `make verify`, on a
# GPU box without network, at the card's own memory or at an emulated smaller card. Same box setup as make_run.sh
# (carried wheels in .whl/ after a call that copied .whl-a to /tmp/whl; the apex export in vendor/apex-25.05*).
# A call cut by its budget leaves what finished; calling again resumes (make run skips finished cells). A capped run
# after an uncapped one shares results/ and re-runs only what the plan sized differently; each call packs what is
# there as $OUT/<preset>-<cap>.tgz with that run's logs.
#
#   RUN_PRESET=full RUN_CAP=none OUT=/path/to/outdir bash tools/gpu/full_run.sh [seconds] [verify]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a directory for the results}
budget=${1:-560}
mode=${2:-}
deadline=$((SECONDS + budget))
venv=${AMPREPRO_VENV:-/tmp/amprepro-venv}
preset=${RUN_PRESET:-full}
cap=${RUN_CAP:-none}
[[ $preset =~ ^[a-z0-9_]{1,32}$ ]] && [ -f "config/presets/$preset.yaml" ] ||
  { echo "RUN_PRESET=$preset is not a preset in config/presets"; exit 1; }
[[ $cap =~ ^(none|[0-9]{1,3}(\.[0-9]{1,2})?)$ ]] || { echo "RUN_CAP=$cap: none or a number of GiB"; exit 1; }
mkdir -p "$OUT"
source tools/gpu/venv.sh || exit 1
bash tools/gpu/apex_config.sh > /tmp/amprepro-gpu.yaml || exit 1
printf 'preset: %s\n' "$preset" >> /tmp/amprepro-gpu.yaml
[ "$cap" = none ] || printf 'gpu_memory_limit_gib: %s\n' "$cap" >> /tmp/amprepro-gpu.yaml
tag=$preset-$cap
started=/tmp/amprepro-started-$tag
[ -f "$started" ] || date +%s > "$started"
args=(VENV="$venv" SNAKEMAKE_ARGS="--configfile config/config.yaml /tmp/amprepro-gpu.yaml")
echo "make run ($tag), $(($(date +%s) - $(cat "$started"))) s after this run's first call"
timeout -k 20 $((deadline - SECONDS - 50)) make run "${args[@]}" >> "/tmp/make-run-$tag.log" 2>&1
rc=$?
echo "make run rc=$rc; $(($(date +%s) - $(cat "$started"))) s since this run's first call"
grep -E "^(amprepro|another run)|steps \(|Error in rule|Nothing to be done" "/tmp/make-run-$tag.log" | tail -n 8
if [ "$rc" = 0 ] && [ "$mode" = verify ] && [ $((deadline - SECONDS)) -gt 35 ]; then
  timeout -k 10 $((deadline - SECONDS - 25)) make verify "${args[@]}" > "/tmp/make-verify-$tag.log" 2>&1
  echo "make verify rc=$?; verdict $(($(date +%s) - $(cat "$started"))) s after this run's first call"
  grep -E "^verify: |PASS|FAIL|NOTHING" "/tmp/make-verify-$tag.log" | head -n 12
fi
python3 tools/gpu/job_seconds.py "/tmp/make-run-$tag.log" > "/tmp/job-seconds-$tag.txt" 2>&1
cp "/tmp/make-run-$tag.log" "/tmp/job-seconds-$tag.txt" "$started" results/ 2>/dev/null
cp "/tmp/make-verify-$tag.log" results/ 2>/dev/null
tar czf "$OUT/$tag.tgz" results/summary results/apex/*.json results/apex/logs results/peak results/sanity \
  results/environment results/runs results/logs results/verify results/plan results/largest_batch \
  results/report/report.html results/make-run-$tag.log results/make-verify-$tag.log results/job-seconds-$tag.txt \
  2>/dev/null
ls -la "$OUT"
