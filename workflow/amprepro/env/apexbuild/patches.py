"""Small, recorded patches applied to the build copy of the source (never to the user's source).

drop-compute_70: up to 25.09, setup.py hard-codes `-gencode arch=compute_70,code=sm_70` for
fused_weight_gradient_mlp_cuda (and two contrib extensions) whatever TORCH_CUDA_ARCH_LIST says. CUDA 13 removed
Volta, so nvcc stops with "Unsupported gpu architecture 'compute_70'". The patch deletes those two-line appends
when nvcc >= 13; the other hard-coded architectures stay, so the extension is built as upstream intends otherwise.

keep-extensions (issue 40): 25.05's setup.py has no switch per extension (only --cpp_ext and --cuda_ext, each adding
a fixed list; the APEX_* variables of 25.09 switch the same lists), so a build of only what the run's cells use
(amprepro.apexexts) deletes the `ext_modules.append(CppExtension/CUDAExtension(name=...))` statements of the others,
found in setup.py's syntax tree, and nothing else. A statement left alone in its block becomes `pass`. An extension
that is not added by such a statement stops the build (the patch would silently build it anyway).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
from pathlib import Path

from packaging.version import Version

from amprepro.env.apexbuild.errors import ApexError
from amprepro.env.apexbuild.setup_inspect import COMPUTE_70_GENCODE, SetupFacts, extension_call_name

KEEP = "keep-extensions"


def planned(setup: SetupFacts, nvcc_release: str | None, left_out: list[str] = ()) -> list[str]:
    names = []
    if nvcc_release and Version(nvcc_release) >= Version("13.0") and setup.compute_70_gencodes:
        names.append("drop-compute_70")
    if left_out:
        names.append(KEEP)
    return names


def apply(names: list[str], source_dir: Path, left_out: list[str] = ()) -> list[dict]:
    """The patches in order; KEEP deletes the extensions in left_out (and needs some)."""
    applied = []
    for name in names:
        if name == "drop-compute_70":
            applied.append(_drop_compute_70(source_dir / "setup.py"))
        elif name == KEEP:
            applied.append(_keep_extensions(source_dir / "setup.py", list(left_out)))
    return applied


def _appended_extension(stmt: ast.stmt) -> str | None:
    """`ext_modules.append(CUDAExtension(name="x", ...))` -> "x"."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "append" and len(call.args) == 1):
        return None
    return extension_call_name(call.args[0])


def _keep_extensions(setup_py: Path, left_out: list[str]) -> dict:
    before = setup_py.read_text()
    lines = before.splitlines(keepends=True)
    deletions: list[tuple[int, int, str | None]] = []  # (first line, last line, replacement) 1-based, inclusive
    found: list[str] = []
    for node in ast.walk(ast.parse(before)):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
                continue
            dropped = [stmt for stmt in block if _appended_extension(stmt) in left_out]
            found += [_appended_extension(stmt) for stmt in dropped]
            for i, stmt in enumerate(dropped):
                keep_block_valid = len(dropped) == len(block) and i == 0
                deletions.append((stmt.lineno, stmt.end_lineno,
                                  " " * stmt.col_offset + "pass\n" if keep_block_valid else None))
    unmatched = sorted(set(left_out) - set(found))
    if unmatched or len(found) != len(set(found)):
        raise ApexError(f"cannot leave {', '.join(unmatched) or 'an extension added twice'} out of the build: "
                        f"setup.py does not add {'it' if len(unmatched) == 1 else 'them'} with one plain "
                        "`ext_modules.append(CUDAExtension(name=...))` statement. Fix: report it; the run's "
                        "extension set comes from its cells (amprepro.apexexts).")
    for first, last, replacement in sorted(deletions, reverse=True):
        lines[first - 1:last] = [replacement] if replacement else []
    after = "".join(lines)
    ast.parse(after)  # a patch that breaks setup.py stops here, not in pip
    setup_py.write_text(after)
    diff = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                "a/setup.py", "b/setup.py", n=1)
    return {
        "name": KEEP,
        "why": "build only the extensions the run's cells use (amprepro.apexexts); setup.py has no switch for one",
        "file": "setup.py",
        "left_out": sorted(left_out),
        "sha256_before": hashlib.sha256(before.encode()).hexdigest(),
        "sha256_after": hashlib.sha256(after.encode()).hexdigest(),
        "diff": "".join(diff),
    }


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
