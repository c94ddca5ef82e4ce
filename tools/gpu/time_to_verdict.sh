#!/bin/bash
# Issue 40's benchmark, on a freshly started one-GPU box: the README's route (`make run`, then `make verify`) with apex
# built cold, timed from the first call's start to the verdict; then, in the same lease, our ViT cells against timm's
# benchmark.py (tools/gpu/timm_compare.py); then $OUT/time-to-verdict.json (tools/gpu/time_to_verdict.py) with the
# run's log. Carry .whl, vendor/apex-25.05, vendor/apex-25.05.source.json and vendor/timm (after the first call that
# brings .whl-a, tools/gpu/README.md). Cut at 10 minutes: call again, it resumes where it stopped.
#
#   COMMIT=<hash> OUT=/path/to/outdir bash tools/gpu/time_to_verdict.sh [seconds]
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
COMMIT=${COMMIT:?set COMMIT to the commit being measured}
[[ $COMMIT =~ ^[0-9a-f]{7,40}$ ]] || { echo "COMMIT=$COMMIT is not a commit hash"; exit 1; }
budget=${1:-570}
deadline=$((SECONDS + budget))
mkdir -p "$OUT"
state=${AMPREPRO_GPU_STATE:-/tmp}  # what a later call on the same box resumes from (a test points it elsewhere)
tag=$(echo "$PWD" | md5sum | cut -c1-8)  # this tree's: another tree measured on the same box starts afresh
started=$state/amprepro-started-$tag  # make_run.sh's
verdict=$state/amprepro-verdict-epoch-$tag
routelog=$state/amprepro-ttv-make-run-$tag.log  # every call's make-run.log, for the job seconds
timmdir=$state/amprepro-timm-$tag
if [ ! -f "$verdict" ]; then
  OUT=$OUT bash tools/gpu/make_run.sh "$((budget - 20))" verify | tee "$OUT/route.out"
  cat "$OUT/make-run.log" >> "$routelog" 2>/dev/null
  # A verdict is the gate's line, PASS, WARNING or FAIL (a FAIL is timed and recorded like a PASS); make's exit code
  # alone does not tell a FAIL from a run cut short or broken.
  grep -qE "^verify: (PASS|WARNING|FAIL):" "$OUT/make-verify.log" 2>/dev/null && date +%s > "$verdict"
  [ -f "$verdict" ] || { echo "no verdict yet: call again"; exit 0; }
fi
venv=${AMPREPRO_VENV:-/tmp/amprepro-venv}
cells=()
for model in vit_timm vit_timm_fused_adamw; do
  for precision in amp_bf16 amp_fp16; do
    [ -f "results/runs/$model/$precision/seed0/metrics.json" ] && cells+=(--cell "results/runs/$model/$precision/seed0")
  done
done
if [ -f vendor/timm/benchmark.py ] && [ ! -f $timmdir/timm_compare.json ] && [ $((deadline - SECONDS)) -gt 150 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout $((deadline - SECONDS - 20)) "$venv/bin/python" tools/gpu/timm_compare.py \
    --benchmark vendor/timm/benchmark.py "${cells[@]}" --apex results/apex/apex.json --out $timmdir
fi
# What one `nvidia-smi -L` costs on this box: the calls a run's jobs no longer make (amprepro.gpuslots.LISTING_ENV)
[ -f "$OUT/nvidia-smi-L-seconds.json" ] || ! command -v nvidia-smi > /dev/null || "$venv/bin/python" -c '
import json, subprocess, sys, time
seconds = []
for _ in range(5):
    start = time.perf_counter()
    subprocess.run(["nvidia-smi", "-L"], capture_output=True)
    seconds.append(round(time.perf_counter() - start, 4))
json.dump({"what": "nvidia-smi -L, 5 calls one after another, after the route", "seconds": seconds}, sys.stdout)
' > "$OUT/nvidia-smi-L-seconds.json"
# benchmark.py carried but the comparison unfinished: the call's budget ended first. What finished goes in, said so.
timm=$timmdir/timm_compare.json timm_note=()
if [ -f vendor/timm/benchmark.py ] && [ ! -f $timm ]; then
  timm_note=(--timm-note "timm's comparison did not finish within this call's budget (call again to finish it)")
  [ -f $timmdir/timm_compare.partial.json ] && timm=$timmdir/timm_compare.partial.json
fi
"$venv/bin/python" tools/gpu/time_to_verdict.py --started "$started" --verdict "$verdict" \
  --log "$routelog" --results results --commit "$COMMIT" --out "$OUT/time-to-verdict.json" \
  $( [ -f $timm ] && echo --timm $timm) "${timm_note[@]}"
cp $timm "$OUT/" 2>/dev/null
gzip -c "$routelog" > "$OUT/make-run.log.gz"
ls -la "$OUT"
