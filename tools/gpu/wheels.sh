#!/bin/bash
# Fetch, on a machine with PyPI, the wheels tools/gpu/make_run.sh installs on a GPU box without network (Python 3.12,
# x86-64): Snakemake, the report's stack and torchao, pinned as in requirements.txt. The box's own torch, torchvision, timm,
# numpy, pandas, matplotlib and scikit-learn are used as they are. Carry .whl/ (and the apex export) in the device call.
#
#   bash tools/gpu/wheels.sh        # writes .whl/ (git-ignored)
set -euo pipefail
cd "$(dirname "$0")/../.."
# torchao: the FP8 precisions (tools/gpu/fp8_run.sh); the box has torch 2.11, which torchao 0.18 accepts (>= 2.11).
pins=$(grep -E '^(snakemake|papermill|nbconvert|nbformat|ipykernel|jupyter_client|jsonschema|torchao)==' requirements.txt)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
mkdir -p .whl
# connection_pool (a Snakemake dependency) is published as an sdist only: build its wheel here first.
python3 -m pip wheel -q --no-deps -w .whl connection_pool==0.0.3
# shellcheck disable=SC2086
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  --find-links .whl -d .whl $pins
# The box has these (KINDS.md's package list); two versions of one package would stop the install.
for name in jinja2 markupsafe pygments psutil pyyaml requests urllib3 idna certifi charset_normalizer attrs packaging \
  tqdm typing_extensions click wrapt tabulate python_dateutil tzdata; do
  rm -f .whl/"$name"-*.whl
done
# A device call carries at most 64 MiB with the working tree (about 21 MiB tracked): the three largest wheels go in
# .whl-a/ (about 27 MB), carried alone in a first call that copies them to /tmp/whl on the box, where venv.sh finds
# them; later calls carry .whl (about 18 MB) and the apex export.
mkdir -p .whl-a
for name in pulp debugpy jedi; do
  mv -f .whl/"$name"-*.whl .whl-a/ 2>/dev/null || true
done
ls .whl | wc -l
ls .whl-a | wc -l
