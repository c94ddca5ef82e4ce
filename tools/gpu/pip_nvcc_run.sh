#!/bin/bash
# GPU evidence for the pip route (issue 23): on the H200 box with its CUDA toolkit hidden, `make run` of the paper
# preset builds apex with nvcc from pip (requirements-cuda13.0.txt, installed by the apex job into the venv) and
# `make verify` passes. The box has no network, so the toolkit's wheels are carried in, in three calls (64 MiB a call,
# the working tree included):
#
#   here:  bash tools/gpu/wheels.sh; bash tools/gpu/cuda_wheels.sh          # .whl/, .whl-cuda/{a,b,c}/ (git-ignored)
#          (and vendor/apex-25.05 + vendor/apex-25.05.source.json, as tools/gpu/README.md says)
#   calls 1-3 (fresh nvidia-h200), carry [".whl-cuda/a"], then [".whl-cuda/b"], then [".whl-cuda/c"]:
#                                                       bash tools/gpu/pip_nvcc_run.sh wheels   (37, 36, 31 MB)
#   call 4, carry [".whl", "vendor/apex-25.05", "vendor/apex-25.05.source.json"]:
#                                                       OUT=$OUT bash tools/gpu/pip_nvcc_run.sh run 560
#   (cut at 10 minutes: call 4 again; make run resumes)
# Calls follow each other at once: the machine goes back 30 s after a call, and a fresh one has none of the wheels
# (`wheels` says which are missing). What comes back: $OUT/toolkit.txt (what was hidden, what was found), build.json,
# apex.json, the apex logs, make-run.log, make-verify.log, results.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?usage: pip_nvcc_run.sh wheels|run [seconds]}
stash=/tmp/amprepro-cuda-wheels
pins=$(grep -E '^nvidia-[a-z-]+==' requirements-cuda13.0.txt | sed 's/==/-/' | tr - _)
missing() {
  for pin in $pins cuda_toolkit_13.0.2; do
    ls "$stash"/"${pin%_*}"-"${pin##*_}"-*.whl > /dev/null 2>&1 || echo "$pin"
  done
}
mkdir -p "$stash"
for dir in .whl-cuda/a .whl-cuda/b .whl-cuda/c; do
  [ -d "$dir" ] && for f in "$dir"/*; do [ -e "$stash/$(basename "$f")" ] || cp "$f" "$stash"/; done
done
# nvvm comes in parts (tools/gpu/cuda_wheels.sh): join what is here and keep the wheel only when it gives the
# recorded sha256 (until every part has come, it does not)
for sum in "$stash"/*.whl.sha256; do
  [ -e "$sum" ] || continue
  wheel=${sum%.sha256}
  if [ ! -e "$wheel" ] && [ -e "$wheel.part-00" ]; then
    cat "$wheel".part-* > "$wheel.tmp" && (cd "$stash" && sed 's|\.whl$|.whl.tmp|' "$sum" | sha256sum -c --quiet - 2>/dev/null) \
      && mv "$wheel.tmp" "$wheel" && echo "joined $(basename "$wheel") (sha256 checked)" \
      || { rm -f "$wheel.tmp"; echo "$(basename "$wheel"): $(ls "$wheel".part-* | wc -l) parts here, not yet the whole wheel"; }
  fi
done
if [ "$mode" = wheels ]; then
  ls -la "$stash"; echo "missing: $(missing | tr '\n' ' ')"; exit 0
fi
[ "$mode" = run ] || { echo "unknown mode $mode"; exit 2; }
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
if [ -n "$(missing)" ]; then
  echo "ERROR: wheels missing in $stash: $(missing | tr '\n' ' '). Fix: calls 1-3 (carry .whl-cuda/a, .whl-cuda/b, .whl-cuda/c)"
  exit 1
fi
say() { echo "$*" | tee -a "$OUT/toolkit.txt"; }
: > "$OUT/toolkit.txt"
say "before: nvcc on PATH: $(command -v nvcc || echo none); CUDA_HOME=${CUDA_HOME:-}; CUDA_PATH=${CUDA_PATH:-}"
say "before: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
# Hide the system toolkit: PATH entries holding an nvcc, CUDA_HOME/CUDA_PATH, its library dirs (the driver's,
# /usr/local/nvidia, stay), and /usr/local/cuda, where torch and the builder look last.
roots=""
for d in ${PATH//:/ }; do [ -x "$d/nvcc" ] && roots="$roots $(dirname "$(readlink -f "$d")")"; done
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do [ -n "$d" ] && [ -e "$d" ] && roots="$roots $(readlink -f "$d")"; done
say "system toolkit roots: ${roots:-none}"
keep() {
  local out="" d r
  for d in ${1//:/ }; do
    for r in $roots; do case "$(readlink -f "$d" 2>/dev/null || echo "$d")" in "$r" | "$r"/*) continue 2 ;; esac; done
    [ -x "$d/nvcc" ] && continue
    out="${out:+$out:}$d"
  done
  echo "$out"
}
PATH=$(keep "$PATH")
LD_LIBRARY_PATH=$(keep "${LD_LIBRARY_PATH:-}")
export PATH LD_LIBRARY_PATH
unset CUDA_HOME CUDA_PATH
if [ -e /usr/local/cuda ]; then
  if mv /usr/local/cuda /usr/local/cuda.hidden-by-amprepro 2>/dev/null; then
    trap 'mv /usr/local/cuda.hidden-by-amprepro /usr/local/cuda' EXIT
    say "/usr/local/cuda moved aside for this call (moved back at its end)"
  else
    say "/usr/local/cuda could not be moved aside: the pip route is forced with AMPREPRO_NVCC=pip (not chosen by itself)"
    export AMPREPRO_NVCC=pip
  fi
fi
say "after: nvcc on PATH: $(command -v nvcc || echo none); PATH=$PATH; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
say "after: torch's CUDA_HOME: $(python3 -c 'import torch.utils.cpp_extension as c; print(c.CUDA_HOME)' 2>&1 | tail -1)"
if command -v nvcc > /dev/null; then say "ERROR: nvcc still found at $(command -v nvcc)"; exit 1; fi
# the toolkit's wheels for the apex job's pip (no network here), a cache of its own (a cold build)
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$stash APEX_CACHE_DIR=/tmp/amprepro-apex-cache-pip
bash tools/gpu/make_run.sh "${2:-560}" verify
for f in results/apex/build.json results/apex/apex.json results/logs/apex_build.log results/logs/apex.log \
  results/apex/logs/build-*.log; do [ -f "$f" ] && cp "$f" "$OUT/"; done
python3 - <<'PY' | tee -a "$OUT/toolkit.txt"
import json, pathlib
p = pathlib.Path("results/apex/build.json")
if p.is_file():
    b = json.loads(p.read_text())
    n = b.get("nvcc") or {}
    print(f"apex_build: {b.get('cache')} in {b.get('seconds')} s, jobs {b.get('jobs')}; nvcc {n.get('release')} "
          f"({n.get('source')}) {n.get('nvcc')}: {n.get('reason')}")
else:
    print("no results/apex/build.json yet")
PY
