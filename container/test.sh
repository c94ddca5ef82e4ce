#!/bin/bash
# make container-test: build the image with podman and run the smoke preset in it, with no network for either.
#
# 1. the base: localhost/amprepro-base:bookworm (container/make_base.sh, mmdebstrap) unless BASE names another
# 2. the wheelhouse: `pip wheel` of the pins into container/wheels/ (here, where pip reaches an index), so the image
#    build needs no network; on this CPU machine torch==2.13.0 resolves to the CPU wheel
# 3. podman build --network=none (apex's build step runs: with a CPU torch it records why apex is not built)
# 4. podman run --network=none with the smoke preset: make run, the image's default command
# Output: $OUT (default results-reference/container/): info.txt (steps, times), build.log, run.log, run-readonly.log,
# run-results/ (the first run, no per-step CSVs), readonly-summary/ and readonly-apex/ (the read-only run).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-results-reference/container}")  # absolute: it is mounted into the container
BASE=${BASE:-localhost/amprepro-base:bookworm}
TAG=${TAG:-localhost/amprepro:test}
rm -rf "$OUT"/info.txt "$OUT"/build.log "$OUT"/run*.log "$OUT"/run-results "$OUT"/readonly-*
mkdir -p "$OUT"
# PODMAN_SANDBOX=1: the podman settings this repository's test machine needs (container/podman-sandbox.conf says why)
[ "${PODMAN_SANDBOX:-0}" = 1 ] && export CONTAINERS_CONF=$PWD/container/podman-sandbox.conf
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
{
  echo "container test at $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(uname -n), $(stamp)"
  podman --version; buildah --version 2>/dev/null || true
} | tee "$OUT/info.txt"
if ! podman image exists "$BASE"; then
  [ "$BASE" = localhost/amprepro-base:bookworm ] || { echo "base image $BASE not found"; exit 1; }
  SECONDS=0; bash container/make_base.sh; echo "base: ${SECONDS} s (mmdebstrap + import)" | tee -a "$OUT/info.txt"
fi
SECONDS=0
# Resolved for the image's Python (Debian 12: 3.11.2; some unpinned dependencies' newest releases need >= 3.11.5):
# binary wheels only, for its glibc; the one sdist-only dependency (connection_pool) is built into a wheel first.
image_python=$(podman run --rm --network=none "$BASE" python3 -c 'import platform; print(platform.python_version())')
platforms=(--platform manylinux2014_x86_64)
for n in $(seq 17 36); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip wheel --quiet --no-deps -w container/wheels connection_pool==0.0.3
python3 -m pip download --quiet --only-binary=:all: --python-version "$image_python" --implementation cp \
  "${platforms[@]}" --find-links container/wheels -d container/wheels -r requirements.txt \
  -r profiles/slurm/requirements.txt 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
echo "image python: $image_python" | tee -a "$OUT/info.txt"
echo "wheelhouse: $(ls container/wheels/*.whl | wc -l) wheels, $(du -sh container/wheels | cut -f1), ${SECONDS} s" \
  | tee -a "$OUT/info.txt"
SECONDS=0
set +e
podman build --no-cache --network=none --build-arg BASE="$BASE" --build-arg PIP_NO_INDEX=1 -f container/Containerfile -t "$TAG" . > "$OUT/build.log" 2>&1
rc=$?
set -e
echo "image build: rc=$rc, ${SECONDS} s, network none" | tee -a "$OUT/info.txt"
[ "$rc" = 0 ] || { tail -n 40 "$OUT/build.log"; exit "$rc"; }
podman image inspect --format 'image {{.Id}}, {{.Size}} bytes' "$TAG" | tee -a "$OUT/info.txt"
mkdir -p "$OUT/run-results"  # not named results/: git ignores those
SECONDS=0
set +e
podman run --rm --network=none -v "$OUT/run-results:/opt/amprepro/results" \
  -e SNAKEMAKE_ARGS="--configfile config/config.yaml container/image.yaml --config preset=smoke" \
  "$TAG" > "$OUT/run.log" 2>&1
rc=$?
set -e
echo "smoke run in the image (make run, the default command): rc=$rc, ${SECONDS} s, network none" \
  | tee -a "$OUT/info.txt"
tail -n 5 "$OUT/run.log"
[ "$rc" = 0 ] || exit "$rc"
# As Apptainer runs a SIF: the image read-only, the run in a writable directory given with --directory, a writable
# home (Apptainer binds the user's; Snakemake keeps a source cache in ~/.cache)
ro=$(mktemp -d)
SECONDS=0
set +e
podman run --rm --network=none --read-only --tmpfs /root -v "$ro:/run1" \
  -e SNAKEMAKE_ARGS="--configfile /opt/amprepro/config/config.yaml /opt/amprepro/container/image.yaml --directory /run1 --config preset=smoke" \
  "$TAG" > "$OUT/run-readonly.log" 2>&1
rc=$?
set -e
echo "smoke run in the read-only image, results in a mounted --directory: rc=$rc, ${SECONDS} s, network none" \
  | tee -a "$OUT/info.txt"
tail -n 3 "$OUT/run-readonly.log"
# keep what says what ran: the first run's results without per-step CSVs, the second run's summary and apex records
find "$OUT/run-results" -name 'steps.csv' -delete
[ -d "$ro/results/summary" ] && cp -r "$ro/results/summary" "$OUT/readonly-summary"
[ -d "$ro/results/apex" ] && cp -r "$ro/results/apex" "$OUT/readonly-apex"
rm -rf "$ro"
du -sh "$OUT/run-results" | tee -a "$OUT/info.txt"
exit "$rc"
