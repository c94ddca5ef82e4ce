"""The report runs in envs/report.yaml, which has no torch (tests/conda runs it there, in minutes): every module the
notebook imports, and the sections that read torch-side settings (the FP8 filter), work with torch unimportable."""

from __future__ import annotations

import json
import subprocess
import sys

from workflow_testing import REPO

BLOCKED = ("torch", "torchao", "torchvision", "timm", "apex")


def notebook_imports() -> list[str]:
    cells = json.loads((REPO / "notebooks" / "report.ipynb").read_text())["cells"]
    return [line for c in cells if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()
            if line.startswith(("import amprepro", "from amprepro"))]


def test_the_notebooks_modules_and_the_fp8_section_need_no_torch():
    imports = notebook_imports()
    assert any("fp8" in line for line in imports) and any("reporthtml" in line for line in imports), imports
    fp8_cell = {"model": "gpt124m", "precision": "fp8_rowwise", "seed": 0, "status": "ok", "speedup_vs_baseline": 1.2,
                "memory_ratio_vs_baseline": 0.9, "loss_gap_final_vs_baseline": 0.001}
    base_cell = {"model": "gpt124m", "precision": "amp_bf16_compile", "seed": 0, "status": "ok"}
    code = "\n".join([
        "import sys",
        *[f"sys.modules[{name!r}] = None" for name in BLOCKED],  # `import torch` now raises ImportError
        *imports,
        "from amprepro.report import fp8section",
        f"print(fp8section.section_html({{'cells': {[fp8_cell, base_cell]!r}}}))",
        "print(fp8section.section_html({'cells': []}))",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "workflow"), "MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gpt124m" in done.stdout, done.stdout[:2000]
    assert "not the output layer" in done.stdout  # the filter, stated without importing amprepro.train.float8
    assert "no FP8 cell in this run" in done.stdout
