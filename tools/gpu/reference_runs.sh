#!/bin/bash
# Two independent reference runs of the paper preset at once on a 2-GPU box, each its own `make run` (through
# tools/gpu/make_run.sh) in its own copy of the tree; amprepro.gpuslots gives every GPU job of either run a GPU of its
# own, so two timed cells never share one. The second run starts once the first has built apex and takes the
# shared wheel cache. Call again after a cut call: both resume.
#
#   OUT=/path/to/outdir tools/gpu/reference_runs.sh [seconds]
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
mkdir -p "$OUT"
budget=${1:-560}
second=/tmp/amprepro-run2
[ -d "$second" ] || { mkdir -p "$second" && tar cf - --exclude=./results --exclude=./.snakemake . | tar xf - -C "$second"; }
OUT=$OUT/run1 bash tools/gpu/make_run.sh "$budget" > "$OUT/run1.out" 2>&1 &
first=$!
for _ in $(seq "$budget"); do
  { [ -f results/apex/apex.json ] || ! kill -0 "$first" 2>/dev/null; } && break
  sleep 1
done
(cd "$second" && OUT=$OUT/run2 bash tools/gpu/make_run.sh $((budget - SECONDS)) > "$OUT/run2.out" 2>&1) &
wait

for run in run1 run2; do echo "== $run"; cat "$OUT/$run.out"; done
