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

Parsing and dumping the package's syntax trees costs about 0.75 s of CPU, and Snakemake pays it at every DAG build: a
`make run`, a dry run, and each Slurm job's own Snakemake. `keep_trees_in(file)` (the Snakefile's call, a file under
.snakemake/) keeps each file's stripped tree and import statements between processes, keyed by the sha256 of the
file's bytes, this module's own source and the Python version, so a hit is what parsing those bytes gives; how the
imports resolve to files is worked out again every time, from the package as it is.
"""

from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import json
import os
import sys
import tempfile
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
    source = path.read_bytes()
    key = hashlib.sha256(source).hexdigest()
    known = _TREES.get(key)
    if known is None:
        tree = parse(path, source)
        known = _TREES.put(key, _import_statements(tree), _stripped_dump(tree))
    statements, dump = known
    return frozenset(_imports(statements)), dump


def _import_statements(tree: ast.Module) -> list[list[str]]:
    """The file's absolute imports of the package, wherever they are: [module] for `import amprepro.x`, [module,
    name...] for `from amprepro.x import name...` (whether a name is a module is decided later, by _imports)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [[alias.name] for alias in node.names if alias.name.startswith(f"{PACKAGE}.")]
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and (node.module == PACKAGE or node.module.startswith(f"{PACKAGE}."))):
            found.append([node.module, *(alias.name for alias in node.names)])
    return found


def _imports(statements: list[list[str]]) -> set[str]:
    """Dotted names below the package: `from amprepro.train import models` names train and train.models."""
    names = set()
    for module, *imported in statements:
        if not imported:
            names.add(module.split(".", 1)[1])
        elif module == PACKAGE:
            names |= set(imported)
        else:
            below = module.split(".", 1)[1]
            names.add(below)
            names |= {f"{below}.{name}" for name in imported if _is_module(f"{below}.{name}")}
    return names


def _is_module(name: str, package_dir: Path = PACKAGE_DIR) -> bool:
    path = package_dir.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def parse(path: Path, source: bytes | None = None) -> ast.Module:
    """The file's syntax tree (from `source`, its bytes already read, where given); a syntax error names the file."""
    return ast.parse(path.read_bytes() if source is None else source, filename=str(path))


def _stripped_dump(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and has_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def has_docstring(node) -> bool:
    first = node.body[0] if node.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


class _Trees:
    """Each source file's import statements and stripped tree by the sha256 of its bytes: in this process always, and
    in a file between processes once keep_trees_in has named one."""

    def __init__(self):
        self.entries: dict[str, list] = {}
        self.used: set[str] = set()
        self.file: Path | None = None
        self.changed = False

    def get(self, key: str) -> tuple[list, str] | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        self.used.add(key)
        return entry[0], entry[1]

    def put(self, key: str, statements: list, dump: str) -> tuple[list, str]:
        self.entries[key] = [statements, dump]
        self.used.add(key)
        self.changed = True
        return statements, dump

    def load(self, file: Path) -> None:
        self.file = file
        try:
            kept = json.loads(file.read_text())
        except (OSError, ValueError):  # none yet, unreadable or cut short: parse again, write it anew
            return
        if isinstance(kept, dict) and kept.get("version") == _version() and isinstance(kept.get("files"), dict):
            self.entries = {**kept["files"], **self.entries}

    def save(self) -> None:
        """The trees this process used (the files as they are now: an edited file's old tree goes), written whole and
        atomically (a Snakemake beside this one reads the old file or this one), when one was new; never an error."""
        if self.file is None or not self.changed:
            return
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.file.parent, prefix=f".{self.file.name}.")
            with os.fdopen(handle, "w") as out:
                json.dump({"version": _version(), "files": {key: self.entries[key] for key in sorted(self.used)}}, out)
            os.replace(temporary, self.file)
            self.changed = False
        except OSError:
            pass


@functools.cache
def _version() -> str:
    """What a kept tree depends on besides the file: how this module strips and dumps, and Python's ast."""
    own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return f"{own} python {sys.version_info.major}.{sys.version_info.minor}"


_TREES = _Trees()


def keep_trees_in(file: Path) -> None:
    """Keep the parsed trees in this file between processes (read now, written when the process ends)."""
    if _TREES.file is None:
        atexit.register(_TREES.save)
    _TREES.load(Path(file))
