"""Stop the image build unless apex was built where it can be: `python container/apex_built.py results/apex/apex.json`.

While an image is built there is no GPU, so the workflow treats apex as optional and records a failed build as
skipped. With a CUDA build of torch in the image, that would ship an image without apex: this turns it into a failed
image build, naming the reason. With a CPU torch (a CPU image, or the smoke test of the recipe) apex cannot be built
at all, and the reason is printed and the build goes on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    record = json.loads(Path(argv[0]).read_text())
    import torch

    nvcc = record.get("nvcc") or {}
    if record["status"] == "built":
        print(f"apex in the image: {record['reason']}; nvcc {nvcc.get('release')} ({nvcc.get('source')}: "
              f"{nvcc.get('nvcc')}); cache entry {record['cache']['entry']}")
        return 0
    if torch.version.cuda is None:
        print(f"apex not in the image: torch {torch.__version__} is a CPU build ({record['reason']})")
        return 0
    print(f"ERROR: apex was not built although torch {torch.__version__} has CUDA {torch.version.cuda}: "
          f"{record['reason']}. See results/logs/apex_build.log above; fix the cause and build the image again.",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
