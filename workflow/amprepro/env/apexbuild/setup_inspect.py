"""What a source's setup.py offers, read statically (running it would need the toolchain we are about to check).

apex selects extensions with command-line flags (`if "--cuda_ext" in sys.argv:`) and, from 25.09 on, also with
APEX_* environment variables (`has_flag("--cuda_ext", "APEX_CUDA_EXT")`). Every CppExtension/CUDAExtension call
under such a test is attributed to that flag, including ones behind nested version checks, which for any CUDA
that builds apex today are true.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

CORE_FLAGS = ("--cpp_ext", "--cuda_ext")
EXTENSION_CLASSES = {"CppExtension": "cpp", "CUDAExtension": "cuda"}
# 25.05 compares the nvcc release with torch.version.cuda for equality (check_cuda_torch_binary_vs_bare_metal).
STRICT_CUDA_CHECK = "bare_metal_version != torch_binary_version"
# 25.05 runs `nvcc -V` at module level (`_, bare_metal_version = get_cuda_bare_metal_version(CUDA_HOME)`), so even a
# build without --cpp_ext/--cuda_ext (the shell) needs an nvcc: without CUDA_HOME it stops with a TypeError.
NVCC_AT_IMPORT = re.compile(r"^\S.*get_cuda_bare_metal_version\(CUDA_HOME\)", re.MULTILINE)
COMPUTE_70_GENCODE = re.compile(
    r'^[ \t]*cc_flag\.append\("-gencode"\)\n[ \t]*cc_flag\.append\("arch=compute_70,code=sm_70"\)\n', re.MULTILINE)


@dataclass(frozen=True)
class SetupFacts:
    extensions: dict[str, dict[str, str]]  # flag -> {extension name: "cpp" | "cuda"}
    env_vars: dict[str, str]  # flag -> environment variable that also turns it on
    parallel_env: bool  # APEX_PARALLEL_BUILD understood
    parallel_option: bool  # "--parallel N" understood
    strict_cuda_check: bool
    compute_70_gencodes: int
    has_amp: bool
    nvcc_at_import: bool = False  # setup.py runs nvcc whatever the flags (NVCC_AT_IMPORT)
    sources: dict[str, int] | None = None  # extension name -> its number of source files (1 where not a list literal)

    def core_flags(self) -> list[str]:
        return [flag for flag in CORE_FLAGS if self.extensions.get(flag)]

    def promised(self, flags: list[str]) -> dict[str, str]:
        return {name: kind for flag in flags for name, kind in self.extensions.get(flag, {}).items()}

    def needs_cuda(self, flags: list[str]) -> bool:
        return "cuda" in self.promised(flags).values()

    def flags_for(self, extensions: list[str]) -> list[str]:
        """The core flags that add at least one of these extensions, in CORE_FLAGS' order."""
        return [flag for flag in self.core_flags() if set(self.extensions[flag]) & set(extensions)]

    def source_count(self, name: str) -> int:
        return (self.sources or {}).get(name, 1)


def inspect_setup(text: str, has_amp: bool) -> SetupFacts:
    tree = ast.parse(text)
    return SetupFacts(
        extensions=_extensions_by_flag(tree),
        env_vars=_env_vars(tree),
        parallel_env="APEX_PARALLEL_BUILD" in text,
        parallel_option='"--parallel" in sys.argv' in text,
        strict_cuda_check=STRICT_CUDA_CHECK in text,
        compute_70_gencodes=len(COMPUTE_70_GENCODE.findall(text)),
        has_amp=has_amp,
        nvcc_at_import=bool(NVCC_AT_IMPORT.search(text)),
        sources=_source_counts(tree),
    )


def _flags_in(test: ast.expr) -> list[str]:
    return [node.value for node in ast.walk(test)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--")]


def _extension(node: ast.AST) -> tuple[str, str] | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
    if func not in EXTENSION_CLASSES:
        return None
    name = next((kw.value for kw in node.keywords if kw.arg == "name"), node.args[0] if node.args else None)
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        return name.value, EXTENSION_CLASSES[func]
    return None


def extension_call_name(node: ast.AST) -> str | None:
    """The name of the CppExtension/CUDAExtension that this call builds, or None."""
    ext = _extension(node)
    return ext[0] if ext else None


def _source_counts(tree: ast.Module) -> dict[str, int]:
    counts = {}
    for node in ast.walk(tree):
        if (name := extension_call_name(node)) is not None:
            sources = next((kw.value for kw in node.keywords if kw.arg == "sources"),
                           node.args[1] if len(node.args) > 1 else None)
            counts[name] = len(sources.elts) if isinstance(sources, ast.List) else 1
    return counts


def _extensions_by_flag(tree: ast.Module) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}

    def visit(node: ast.AST, flags: list[str]) -> None:
        if isinstance(node, ast.If) and (tested := _flags_in(node.test)):
            for child in node.body:
                visit(child, tested)
            for child in node.orelse:
                visit(child, flags)
            return
        if flags and (ext := _extension(node)):
            for flag in flags:
                found.setdefault(flag, {})[ext[0]] = ext[1]
        for child in ast.iter_child_nodes(node):
            visit(child, flags)

    visit(tree, [])
    return found


def _env_vars(tree: ast.Module) -> dict[str, str]:
    """flag -> env var, from a dict literal like ENV_TO_FLAG = {"APEX_CPP_EXT": "--cpp_ext", ...}."""
    pairs = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("APEX_")
                        and isinstance(value, ast.Constant) and str(value.value).startswith("--")):
                    pairs[value.value] = key.value
    return pairs
