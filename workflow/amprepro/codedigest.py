"""The code a stage's results depend on, as one digest that ignores comments, docstrings and formatting.

Rules pass it as a `params:` entry (`code=code_digest("train.train")`, dotted names below the package), so Snakemake's
params trigger re-runs a job when that
code really changes. Listed as `input:` files, the modules re-ran a job whenever their bytes were newer and different
from the outputs' record, so a comment edit re-ran every cell.

A stage's code is the modules it names and every amprepro module those import, transitively (an imported package
counts whole: env.apexbuild runs some of its files as scripts). amprepro.files is left out: it decides how a result is
written (atomically, with which mode), never what it says.

Files the code reads as code, such as the report's Jinja2 templates, are named with `files=` (paths relative to the
workflow directory, a folder counting with every file in it) and digested byte for byte.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE = PACKAGE_DIR.name
WRITES_ONLY = {"files"}


def code_digest(*modules: str, files=(), package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 over the stripped syntax trees of the stage's source files and the bytes of its other code files,
    labelled so that Snakemake's "Params have changed" reason says what it is."""
    digest = hashlib.sha256()
    for path in stage_files(modules, package_dir):
        digest.update(f"{path.relative_to(package_dir)}\0{source_tree(path)}\0".encode())
    for path in data_files(files, package_dir.parent):
        digest.update(f"{path.relative_to(package_dir.parent)}\0".encode() + path.read_bytes() + b"\0")
    names = [f"{PACKAGE}.{name}" for name in modules] + list(files)
    return f"code of {', '.join(names)}: sha256 {digest.hexdigest()}"


def data_files(files, workflow_dir: Path) -> list[Path]:
    """The files named (relative to the workflow directory), a folder standing for every file below it."""
    out = []
    for name in files:
        path = workflow_dir / name
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        elif path.is_file():
            out.append(path)
        else:
            raise ValueError(f"{name} is not a file or folder of {workflow_dir}")
    return out


def stage_files(modules, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    seen, todo = set(), [module_paths(name, package_dir) for name in modules]
    while todo:
        for path in todo.pop():
            if path not in seen:
                seen.add(path)
                todo.append([p for name in imported_modules(path) for p in module_paths(name, package_dir)])
    return sorted(seen)


def module_paths(name: str, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The files of amprepro.<name> (a dotted name below the package, e.g. train.models): one module with the
    __init__.py of the subpackages above it, or every file of a package below a subpackage (env.apexbuild runs some of
    its files as scripts). A subpackage itself (train, env, report) is its __init__.py only: importing one module of
    it never runs the others."""
    parts = name.split(".")
    if parts[0] in WRITES_ONLY:
        return []
    inits = [package_dir.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    for depth in range(2, len(parts) + 1):
        folder = package_dir.joinpath(*parts[:depth])
        if folder.is_dir():
            return sorted({*folder.rglob("*.py"), *inits[: depth - 1]})
    path = package_dir.joinpath(*parts)
    if path.is_dir():
        return [path / "__init__.py"]
    if path.with_suffix(".py").is_file():
        return [*inits, path.with_suffix(".py")]
    raise ValueError(f"amprepro.{name} is not a module of {package_dir}")


def imported_modules(path: Path) -> set[str]:
    """Names (below the package) of the amprepro modules a file imports, wherever the import statement is."""
    return set(_file_facts(path, _stamp(path))[0])


def source_tree(path: Path) -> str:
    """The file's syntax tree without docstrings; comments and layout never reach the tree."""
    return _file_facts(path, _stamp(path))[1]


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=512)
def _file_facts(path: Path, stamp: tuple[int, int]) -> tuple[frozenset[str], str]:
    """One parse per file and version: every rule's digest at DAG build time reads the same modules."""
    tree = parse(path)
    return frozenset(_imports(tree)), _stripped_dump(tree)


def _imports(tree: ast.Module) -> set[str]:
    """Dotted names below the package: `from amprepro.train import models` names train and train.models."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".", 1)[1] for alias in node.names if alias.name.startswith(f"{PACKAGE}.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE:
                names |= {alias.name for alias in node.names}
            elif node.module.startswith(f"{PACKAGE}."):
                below = node.module.split(".", 1)[1]
                names.add(below)
                names |= {f"{below}.{alias.name}" for alias in node.names if _is_module(f"{below}.{alias.name}")}
    return names


def _is_module(name: str, package_dir: Path = PACKAGE_DIR) -> bool:
    path = package_dir.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _stripped_dump(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and has_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def has_docstring(node) -> bool:
    first = node.body[0] if node.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
