#!/usr/bin/env bash
# Install the rattler-backed conda stand-in (testing only; see README.md here).
#   --venv DIR   its own Python venv with py-rattler & co from requirements.txt (kept when it is already complete)
#   --base DIR   a conda "base prefix": bin/conda (the stand-in), bin/activate, .condarc, envs/, pkgs/, channels/.
#                .condarc's channel_alias is file://DIR/channels/, so the channel name conda-forge means
#                DIR/channels/conda-forge (build it with mkchannel.py). Put DIR/bin first on PATH: `conda` is the stand-in.
# Usage: tools/conda-offline/setup.sh --venv VENV [--base BASE]     (python3 must be CPython 3.11; PYTHON overrides)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="" base=""
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) venv="$2"; shift 2 ;;
        --base) base="$2"; shift 2 ;;
        *) echo "usage: $0 --venv VENV [--base BASE]" >&2; exit 2 ;;
    esac
done
[ -n "$venv" ] || { echo "usage: $0 --venv VENV [--base BASE]" >&2; exit 2; }
wanted="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$wanted" ]; then
    "${PYTHON:-python3}" -m venv --clear "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
    echo "$wanted" > "$venv/.requirements.sha256"
fi
venv="$(cd "$venv" && pwd)"
[ -n "$base" ] || exit 0
mkdir -p "$base/bin" "$base/envs" "$base/pkgs" "$base/channels" "$base/conda-meta"
base="$(cd "$base" && pwd)"
cat > "$base/bin/conda" <<CONDA
#!/bin/sh
# rattler-backed stand-in for the conda CLI, for testing only: $here/conda_standin.py
CONDA_STANDIN_BASE='$base' exec '$venv/bin/python' '$here/conda_standin.py' "\$@"
CONDA
chmod +x "$base/bin/conda"
cp "$here/activate" "$base/bin/activate"
printf 'channel_alias: file://%s/channels/\nchannels: [conda-forge]\nchannel_priority: strict\n' "$base" > "$base/.condarc"
echo "conda stand-in (testing only) in $base: PATH=$base/bin:\$PATH"
