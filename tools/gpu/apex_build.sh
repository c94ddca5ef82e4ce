#!/bin/bash
# Build one apex ref on a GPU box through the apex rule's own command and keep the evidence (no wheels, no apex code):
#
#   OUT=/path/to/outdir [APEX_EXTENSIONS=amp_C,fused_layer_norm_cuda] tools/gpu/apex_build.sh REF COMMIT [seconds]
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
# APEX_EXTENSIONS=amp_C,fused_layer_norm_cuda builds only those (what the paper preset's cells use, issue 40; the
# rules derive it from the run matrix, amprepro.apexexts); unset: every extension --cpp_ext/--cuda_ext add. The stage
# checks each name (a Python identifier that setup.py's core flags add) before setup.py sees it.
settings=$(python3 - "$ref" "$commit" "${APEX_EXTENSIONS:-}" <<'PY'
import json, sys
ref, commit, extensions = sys.argv[1:]
print(json.dumps({"required": True, "source": {"path": f"vendor/apex-{ref}", "ref": ref, "commit": commit, "url": None,
                  "tarball": None, "sha256": None}, "cuda_arch_list": None, "cache_dir": "/tmp/amprepro-apex-cache",
                  "build_jobs": None, "extensions": extensions.split(",") if extensions else None}))
PY
)
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
