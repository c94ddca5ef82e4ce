#!/usr/bin/env bash
# ci-setup: parallel
# tests/conda runs `snakemake --use-conda` for real, offline, against the rattler-backed conda stand-in (testing only,
# tools/conda-offline). This installs the stand-in's own venv (py-rattler & co, pinned in
# tools/conda-offline/requirements.txt) into vendor/conda-offline/venv, which is gitignored. The local channel and the
# conda base prefix are built by the test itself in its tmp dir, from the project's .venv; nothing is cached across runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/conda-offline/setup.sh --venv vendor/conda-offline/venv
vendor/conda-offline/venv/bin/python -c "import rattler; print('conda stand-in venv ready: py-rattler', rattler.__version__)"
