#!/bin/bash
# Issue 41's walk-through on a GPU box, after a finished run in results/ (tools/gpu/time_to_verdict.sh or make_run.sh):
# delete the apex build entry under results/ that apex.json names (results/apex/build/<key>, the shared cache at
# /tmp/amprepro-apex-cache keeps its copy), run `make run` again, and show what it said and did, then `make verify`.
#
#   OUT=/path/to/outdir bash tools/gpu/apex_entry_gone.sh [seconds]
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
budget=${1:-200}
deadline=$((SECONDS + budget))
venv=${AMPREPRO_VENV:-/tmp/amprepro-venv}
mkdir -p "$OUT"
source tools/gpu/venv.sh || exit 1
entry=$("$venv/bin/python" -c 'import json; print(json.load(open("results/apex/build.json"))["entry"])') || exit 1
key=$(basename "$entry")
[[ $key =~ ^[0-9a-zA-Z_.-]{4,80}$ ]] || { echo "unexpected build key $key"; exit 1; }
{
  echo "apex.json names entry $entry; results/apex/build/$key before: $(ls results/apex/build/"$key" | wc -l) files"
  rm -rf "results/apex/build/$key"
  echo "removed results/apex/build/$key; apex.json still there: $(test -f results/apex/apex.json && echo yes)"
} | tee "$OUT/walkthrough.txt"
args=(VENV="$venv" SNAKEMAKE_ARGS="--configfile config/config.yaml /tmp/amprepro-gpu.yaml")
start=$SECONDS
timeout $((deadline - SECONDS - 40)) make run "${args[@]}" > "$OUT/make-run-after-delete.log" 2>&1
echo "make run rc=$? in $((SECONDS - start)) s" | tee -a "$OUT/walkthrough.txt"
grep -E "^amprepro|^\[apex\]|^localrule|^rule |Nothing to be done|Error in rule" "$OUT/make-run-after-delete.log" |
  sort | uniq -c | sort -rn | head -n 30 | tee -a "$OUT/walkthrough.txt"
echo "results/apex/build/$key now: $(ls results/apex/build/"$key" 2>/dev/null | wc -l) files" | tee -a "$OUT/walkthrough.txt"
timeout $((deadline - SECONDS - 5)) make verify "${args[@]}" > "$OUT/make-verify-after-delete.log" 2>&1
echo "make verify rc=$?" | tee -a "$OUT/walkthrough.txt"
grep -E "^verify: " "$OUT/make-verify-after-delete.log" | head -n 4 | tee -a "$OUT/walkthrough.txt"
