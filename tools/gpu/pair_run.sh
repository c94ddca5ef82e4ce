#!/bin/bash
# One preset twice at once on a 2-GPU box (default: full): at the card's own memory in this tree and at a cap
# (PAIR_CAP GiB, default 12: the RTX 3060's 12 GB) in a copy under /tmp, each through tools/gpu/full_run.sh (`make
# run`, then `make verify`). amprepro.gpuslots gives every timed cell of either run a GPU of its own; the capped
# run starts once the first has built apex and takes the shared build cache. Each call refreshes the copy's files
# (its results stay); call again after a cut call: both resume.
#
#   OUT=/path/to/outdir RUN_PRESET=full PAIR_CAP=12 bash tools/gpu/pair_run.sh [seconds]
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
budget=${1:-570}
preset=${RUN_PRESET:-full}
cap=${PAIR_CAP:-12}
[[ $cap =~ ^[0-9]{1,3}(\.[0-9]{1,2})?$ ]] || { echo "PAIR_CAP=$cap: a number of GiB"; exit 1; }
mkdir -p "$OUT"
second=/tmp/amprepro-run2
mkdir -p "$second" && tar cf - --exclude=./results --exclude=./.snakemake . | tar xf - -C "$second" ||
  { echo "could not copy the tree to $second"; exit 1; }
RUN_PRESET=$preset RUN_CAP=none OUT=$OUT/uncapped bash tools/gpu/full_run.sh "$budget" verify > "$OUT/uncapped.out" 2>&1 &
first=$!
for _ in $(seq "$budget"); do
  { [ -f results/apex/apex.json ] || ! kill -0 "$first" 2>/dev/null; } && break
  sleep 1
done
(cd "$second" && RUN_PRESET=$preset RUN_CAP=$cap OUT=$OUT/capped \
  bash tools/gpu/full_run.sh $((budget - SECONDS)) verify > "$OUT/capped.out" 2>&1) &
wait
for run in uncapped capped; do echo "== $run"; cat "$OUT/$run.out"; done
