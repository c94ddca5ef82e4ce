#!/bin/bash
# Source this on the GPU box (no network): a venv in $venv that sees the box's own CUDA torch and gets everything else
# from the carried wheels (.whl/, made here by tools/gpu/wheels.sh). Made once per box; later calls reuse it.
#
#   venv=/tmp/amprepro-venv; source tools/gpu/venv.sh
venv=${venv:-${AMPREPRO_VENV:-/tmp/amprepro-venv}}
# flock: the two runs of tools/gpu/reference_runs.sh start together and share the venv.
(
  flock 9
  if [ ! -f "$venv/.ready" ]; then
    rm -rf "$venv"
    # The box's python3 is itself a venv (/opt/torch/.venv): --system-site-packages would not reach its torch, so
    # a .pth file puts its site-packages after the venv's own.
    image_site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
    python3 -m venv "$venv" &&
      echo "$image_site" > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image.pth" &&
      { ls .whl-a/pulp-*.whl > /dev/null 2>&1 || ls /tmp/whl/pulp-*.whl > /dev/null 2>&1 ||
        ls .whl/pulp-*.whl > /dev/null 2>&1 ||
        { echo "no pulp wheel in /tmp/whl or .whl: first a call carrying .whl-a that runs"\
               "'mkdir -p /tmp/whl && cp .whl-a/*.whl /tmp/whl/' (tools/gpu/README.md)"; false; }; } &&
      "$venv/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl \
        $(ls .whl-a/*.whl 2>/dev/null || ls /tmp/whl/*.whl 2>/dev/null) &&
      touch "$venv/.ready" || { echo "venv setup failed"; exit 1; }
  fi
  "$venv/bin/python" -c 'import torch, snakemake, wrapt' || { echo "venv lacks torch or snakemake"; exit 1; }
  # The Makefile's stamp of a finished venv (without it `make run` would reinstall, from PyPI, which is not reachable).
  make -s --no-print-directory venv-hash > "$venv/.amprepro-installed" || { echo "venv stamp not written"; exit 1; }
) 9>/tmp/amprepro-venv.lock || exit 1
