"""A config file read as Snakemake would, without evaluating anything: a broken file's error names line and column."""

from __future__ import annotations

from pathlib import Path

import yaml

from amprepro.config.errors import ConfigError
from amprepro.safevalues import shorten


def read_config_file(path: str | Path) -> dict:
    """A config file as Snakemake would read it, without evaluating anything; ConfigError with file, line and column."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}). "
                          "Fix: check the path and its permissions.") from None
    except UnicodeDecodeError as exc:
        line, column = _position(exc.object, exc.start)
        raise ConfigError(f"{path}, line {line}, column {column}: byte 0x{exc.object[exc.start]:02x} is not UTF-8. "
                          "Fix: save the file as UTF-8.") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_message(path, exc)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: holds a {type(loaded).__name__}, not keys and values. Fix: write it as "
                          "`key: value` lines (preset:, runs:, apex:, ...), as config/config.yaml does.")
    if "__use_yte__" in loaded:
        raise ConfigError(f"{path}: sets __use_yte__, which makes Snakemake evaluate the file as a template with "
                          "Python expressions. Fix: remove __use_yte__ and write plain values (docs/config.md).")
    return loaded


def _position(data: bytes, offset: int) -> tuple[int, int]:
    before = data[:offset]
    return before.count(b"\n") + 1, offset - (before.rfind(b"\n") + 1) + 1


# A construct PyYAML reads until it is closed: a missing closing quote or bracket is found only where the reading
# ends (often the end of the file), so the line to show is where the construct opened (the error's context mark).
UNCLOSED = {"while scanning a quoted scalar": ("a quoted value", "its closing quote"),
            "while parsing a flow sequence": ("a [ list", "its ]"),
            "while parsing a flow mapping": ("a { mapping", "its }")}


def _yaml_message(path: Path, exc: yaml.YAMLError) -> str:
    problem_mark, context_mark = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    unclosed = UNCLOSED.get(getattr(exc, "context", None) or "")
    if unclosed and context_mark is not None:
        what, closing = unclosed
        stopped = f"line {problem_mark.line + 1}" if problem_mark is not None else "the end"
        return (f"{path}, line {context_mark.line + 1}, column {context_mark.column + 1}: not valid YAML ({what} "
                f"starts here and is not closed; the reader stopped at {stopped}: {shorten(problem, 80)}). "
                f"Fix: add {closing} on that line, or quote the value.")
    mark = problem_mark or context_mark
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    if "\t" in problem or "'\\t'" in problem:
        fix = "indent with spaces; YAML does not allow tabs there."
    else:
        fix = ("check the indentation, brackets and quotes on that line or the one before "
               "(a value with ': ' or ' #' needs quotes).")
    return f"{where}: not valid YAML ({shorten(problem, 120)}). Fix: {fix}"
