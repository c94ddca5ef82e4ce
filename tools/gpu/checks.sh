#!/bin/bash
# Same-call checks on a GPU box, after tools/gpu/paper_run.sh has finished the paper preset:
#   1. our ViT cells against timm's benchmark.py (tools/gpu/timm_compare.py),
#   2. the GPU tests (deterministic FP32, strict FP32, loss scale, allocator; DDP when there are 2 GPUs),
#   3. the apex rule re-run with nothing changed but its output (a cache hit), timed end to end.
#
#   OUT=/path/to/outdir tools/gpu/checks.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a directory for the results}
export PATH=/tmp/amprepro-bin:$PATH PYTHONPATH=${PYTHONPATH:-/tmp/amprepro-site}
mkdir -p "$OUT"
cells=()
for model in vit_timm vit_timm_fused_adamw; do
  for precision in amp_bf16 amp_fp16; do
    cell=results/runs/$model/$precision/seed0
    [ -f "$cell/metrics.json" ] && cells+=(--cell "$cell")
  done
done
if [ -f "${TIMM_BENCHMARK:-vendor/timm/benchmark.py}" ] && [ ${#cells[@]} -gt 0 ]; then
  CUDA_VISIBLE_DEVICES=0 python tools/gpu/timm_compare.py --benchmark "${TIMM_BENCHMARK:-vendor/timm/benchmark.py}" \
    "${cells[@]}" --apex results/apex/apex.json --out "$OUT/compare" 2>&1 | tail -n 5
fi
PYTHONPATH=workflow:$PYTHONPATH timeout 400 python -m pytest -q -p no:cacheprovider -rs -s tests/gpu \
  > "$OUT/pytest-gpu.log" 2>&1
echo "pytest tests/gpu rc=$?"; grep -E "gap|passed|failed|SKIP" "$OUT/pytest-gpu.log" | tail -n 8
start=$(date +%s%N)
python -m snakemake results/apex/apex.json --cores "$(nproc)" --resources gpu=1 \
  --configfile config/config.yaml /tmp/amprepro-gpu.yaml > "$OUT/apex-noop.log" 2>&1
echo "apex rule, nothing changed: rc=$? wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))"
start=$(date +%s%N)
python -m snakemake results/apex/apex.json --forcerun apex --cores "$(nproc)" --resources gpu=1 \
  --configfile config/config.yaml /tmp/amprepro-gpu.yaml > "$OUT/apex-rerun.log" 2>&1
echo "apex rule rerun rc=$? wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))"
cp results/logs/apex.log "$OUT/apex-rerun-stage.log" 2>/dev/null
ls -la "$OUT"
