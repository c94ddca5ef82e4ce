#!/bin/bash
# One device call of a GPU evidence session: the paper preset through the pipeline for as long as it needs (results
# stay on the machine while it is warm, so the next call continues), then, once it is complete and enough of this
# call is left, the same-call checks (tools/gpu/checks.sh).
#
#   OUT=/path/to/outdir tools/gpu/session.sh [seconds] [extra-config.yaml]   # again until it prints "checks done"
# (the extra config goes to paper_run.sh, as its second argument)
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
budget=${1:-580}
extra=${2:-}
deadline=$((SECONDS + budget))
CHECKS_SECONDS=${CHECKS_SECONDS:-380}  # pytest tests/gpu ~130 s, four timm comparisons ~200 s, apex rerun ~25 s
OUT=$OUT bash tools/gpu/paper_run.sh "$budget" ${extra:+"$extra"} | tee "$OUT/paper_run.out"
if ! grep -q "snakemake rc=0" "$OUT/paper_run.out"; then
  echo "paper preset not complete yet: call again"
  exit 0
fi
left=$((deadline - SECONDS))
if [ "$left" -lt "$CHECKS_SECONDS" ]; then
  echo "paper preset complete; ${left}s left in this call, checks need ${CHECKS_SECONDS}s: call again"
  exit 0
fi
mkdir -p "$OUT/checks"
OUT=$OUT/checks bash tools/gpu/checks.sh
# Only a few files come back from a device call (2026-11-30: timm_compare.json was left out): one tarball.
tar czf "$OUT/checks.tgz" -C "$OUT" checks && rm -rf "$OUT/checks"
echo "checks done"
