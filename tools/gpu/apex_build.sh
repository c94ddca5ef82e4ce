#!/bin/bash
# Build one apex ref on a GPU box through the apex rule's own command and keep the evidence (no wheels, no apex code):
#
#   OUT=/path/to/outdir tools/gpu/apex_build.sh REF COMMIT [seconds]
#
# The source is a local export, vendor/apex-REF with its vendor/apex-REF.source.json marker, made here with
# `.venv/bin/python -m amprepro.env.apexbuild export --git-dir <apex clone> --ref REF --dest vendor/apex-REF`
# and carried to the box. Runs the stage twice: cold, then again (a cache hit), and packs apex.json, the stage logs and
# the build log for results-reference/apex/REF/.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=workflow
OUT=${OUT:?set OUT to a directory for the results}
ref=${1:?give the apex ref, e.g. 25.09}
commit=${2:?give the commit the ref must resolve to}
budget=${3:-540}
mkdir -p "$OUT"
settings=$(printf '{"required": true, "source": {"path": "vendor/apex-%s", "ref": "%s", "commit": "%s", "url": null,
  "tarball": null, "sha256": null}, "cuda_arch_list": null, "cache_dir": "/tmp/amprepro-apex-cache", "build_jobs": null}' \
  "$ref" "$ref" "$commit")
stage() {  # output-file seconds
  local start=$SECONDS
  timeout "$2" python3 -m amprepro.gpuslots --gpus 1 -- python3 -m amprepro.env.apex_stage --settings "$settings" \
    --out "$1" --jobs "$(nproc)"
  echo "== apex_stage $ref rc=$? wall_s=$((SECONDS - start))"
}
stage "$OUT/apex.json" $((budget - 60)) 2>&1 | tee "$OUT/stage.log"
stage "$OUT/apex-rerun.json" 50 2>&1 | tee "$OUT/stage-rerun.log"
log=$(ls -t results/apex/logs/*.log 2>/dev/null | head -1)
[ -n "$log" ] && gzip -c "$log" > "$OUT/build.log.gz"
ls -la "$OUT"
