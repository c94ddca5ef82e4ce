"""Small, recorded patches applied to the build copy of the source (never to the user's source).

drop-compute_70: up to 25.09, setup.py hard-codes `-gencode arch=compute_70,code=sm_70` for
fused_weight_gradient_mlp_cuda (and two contrib extensions) whatever TORCH_CUDA_ARCH_LIST says. CUDA 13 removed
Volta, so nvcc stops with "Unsupported gpu architecture 'compute_70'". The patch deletes those two-line appends
when nvcc >= 13; the other hard-coded architectures stay, so the extension is built as upstream intends otherwise.
"""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path

from packaging.version import Version

from amprepro.env.apexbuild.setup_inspect import COMPUTE_70_GENCODE, SetupFacts


def planned(setup: SetupFacts, nvcc_release: str | None) -> list[str]:
    if nvcc_release and Version(nvcc_release) >= Version("13.0") and setup.compute_70_gencodes:
        return ["drop-compute_70"]
    return []


def apply(names: list[str], source_dir: Path) -> list[dict]:
    return [_drop_compute_70(source_dir / "setup.py") for name in names if name == "drop-compute_70"]


def _drop_compute_70(setup_py: Path) -> dict:
    before = setup_py.read_text()
    after, count = COMPUTE_70_GENCODE.subn("", before)
    setup_py.write_text(after)
    diff = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                "a/setup.py", "b/setup.py", n=1)
    return {
        "name": "drop-compute_70",
        "why": "CUDA >= 13 has no compute_70; setup.py hard-codes it for fused_weight_gradient_mlp_cuda",
        "file": "setup.py",
        "removed_gencodes": count,
        "sha256_before": hashlib.sha256(before.encode()).hexdigest(),
        "sha256_after": hashlib.sha256(after.encode()).hexdigest(),
        "diff": "".join(diff),
    }
