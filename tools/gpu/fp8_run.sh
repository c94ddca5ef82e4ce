#!/bin/bash
# The FP8 preset (issue 26, config/presets/fp8.yaml, docs/fp8.md) through the README's `make run` on one H200: torchao
# float8 training (tensorwise, rowwise) against compiled bf16 on the 7B LLaMA shape, GPT-124M and ViT-B/16, then
# optionally `make verify`. The box has torch 2.11+cu130 and no torchao and no network: torchao comes from the carried
# wheels (.whl/, made here by tools/gpu/wheels.sh, which fetches torchao==0.18.0 with the rest). No apex cell is in
# the preset, so apex is not built (apex.required false, no source): nothing under vendor/ needs carrying.
#
#   bash tools/gpu/wheels.sh                              # here, once: .whl/ (about 44 MB with torchao's 3.4 MB)
#   [FP8_PRESET=fp8_loss] [FP8_CONFIG=file] OUT=/path/to/outdir bash tools/gpu/fp8_run.sh [seconds] [verify]   # there, carrying .whl (after a call that copied .whl-a to /tmp/whl: tools/gpu/README.md)
#
# A call cut by the budget leaves what finished; calling again resumes (make run skips finished cells).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a directory for the results}
budget=${1:-530}
mode=${2:-}
deadline=$((SECONDS + budget))
venv=${AMPREPRO_VENV:-/tmp/amprepro-venv}
mkdir -p "$OUT"
source tools/gpu/venv.sh || exit 1
# A venv made before torchao was among the wheels: add it from the same carried wheel (no index, no dependencies).
if ! "$venv/bin/python" -c 'import torchao' 2>/dev/null; then
  wheel=$(ls .whl/torchao-0.18.0-*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || { echo "no .whl/torchao-0.18.0-*.whl: run tools/gpu/wheels.sh here and carry .whl"; exit 1; }
  "$venv/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir "$wheel" || exit 1
fi
"$venv/bin/python" - <<'PY' | tee "$OUT/versions.txt"
import torch, torchao.float8
print("torch", torch.__version__, "cuda", torch.version.cuda, "torchao", torchao.__version__,
      "gpu", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
PY
# FP8_PRESET: fp8 (the default: speed) or fp8_loss (the final-loss gap over seeds, docs/fp8.md); a name, nothing else.
preset=${FP8_PRESET:-fp8}
[[ $preset =~ ^[a-z0-9_]+$ ]] && [ -f "config/presets/$preset.yaml" ] || { echo "FP8_PRESET=$preset is not a preset in config/presets"; exit 1; }
cat > /tmp/amprepro-fp8.yaml <<YAML
preset: $preset
apex:
  required: false
  source: {url: null, path: null, tarball: null}
YAML
# FP8_CONFIG: one more config file, read last (e.g. fewer cells for a short call: results-reference/fp8/README.md)
extra=${FP8_CONFIG:-}
if [ -n "$extra" ] && [ ! -f "$extra" ]; then echo "FP8_CONFIG=$extra is not a file"; exit 1; fi
args=(VENV="$venv" SNAKEMAKE_ARGS="--configfile config/config.yaml /tmp/amprepro-fp8.yaml${extra:+ $extra}")
start=$SECONDS
timeout -k 20 $((deadline - SECONDS - 40)) make run "${args[@]}" > "$OUT/make-run.log" 2>&1
rc=$?
echo "make run rc=$rc after $((SECONDS - start)) s"
grep -E "^(amprepro|another run)|steps \(|Error in rule|Nothing to be done" "$OUT/make-run.log" | tail -n 8
"$venv/bin/python" - <<'PY' | tee "$OUT/fp8-table.txt"
import json, pathlib
path = pathlib.Path("results/summary/summary.json")
if not path.exists():
    raise SystemExit("no results/summary/summary.json (make run did not get that far)")
s = json.loads(path.read_text())
print("peak TFLOP/s:", s.get("peak", {}).get("tflops"), s.get("peak", {}).get("fp8"))
keys = ["model", "precision", "status", "throughput_per_s", "baseline_precision", "speedup_vs_baseline",
        "peak_allocated_bytes", "memory_ratio_vs_baseline", "loss_gap_final_vs_baseline", "loss_gap_max_vs_baseline",
        "nonfinite_steps", "fp8_weight_fraction", "mfu_vs_measured_peak", "mfu_vs_datasheet", "reason"]
for c in s["cells"]:
    print(" | ".join(f"{k}={c.get(k)}" for k in keys))
PY
if [ "$rc" = 0 ] && [ "$mode" = verify ] && [ $((deadline - SECONDS)) -gt 30 ]; then
  timeout -k 10 $((deadline - SECONDS - 15)) make verify "${args[@]}" > "$OUT/make-verify.log" 2>&1
  echo "make verify rc=$?"
  tail -n 25 "$OUT/make-verify.log"
fi
python3 tools/gpu/job_seconds.py "$OUT/make-run.log" > "$OUT/job-seconds.txt" 2>&1
tar czf "$OUT/results.tgz" results/summary results/peak results/sanity results/environment results/runs results/logs \
  results/plan results/verify results/report/report.html 2>/dev/null
ls -la "$OUT"
