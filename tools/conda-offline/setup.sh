#!/usr/bin/env bash
# Install the rattler-backed conda stand-in (testing only) into DIR:
#   DIR/venv          its own Python venv with py-rattler & co (requirements.txt)
#   DIR/base          a conda "base prefix": bin/conda (the stand-in), bin/activate, .condarc, envs/, pkgs/
#   DIR/base/channels local channels; .condarc's channel_alias points here, so `conda-forge` means
#                     DIR/base/channels/conda-forge (build it with mkchannel.py)
# Put DIR/base/bin first on PATH and `conda` is the stand-in. Idempotent: an existing venv is kept.
# Usage: tools/conda-offline/setup.sh DIR [PYTHON]     (PYTHON defaults to python3; it must be 3.11)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
python="${2:-python3}"
if [ ! -x "$dir/venv/bin/python" ] || ! "$dir/venv/bin/python" -c "import rattler, zstandard, yaml, snakedeploy" 2>/dev/null; then
    "$python" -m venv "$dir/venv"
    "$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi
base="$dir/base"
mkdir -p "$base/bin" "$base/envs" "$base/pkgs" "$base/channels" "$base/conda-meta"
cat > "$base/bin/conda" <<CONDA
#!/bin/sh
# rattler-backed stand-in for the conda CLI, for testing only: $here/conda_standin.py
CONDA_STANDIN_BASE='$base' exec '$dir/venv/bin/python' '$here/conda_standin.py' "\$@"
CONDA
chmod +x "$base/bin/conda"
cp "$here/activate" "$base/bin/activate"
printf 'channel_alias: file://%s/channels/\nchannels: [conda-forge]\nchannel_priority: strict\n' "$base" > "$base/.condarc"
echo "conda stand-in ready: PATH=$base/bin:\$PATH  (channels in $base/channels/)"
