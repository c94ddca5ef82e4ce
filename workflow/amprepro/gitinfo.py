"""The pipeline's own commit: the one git helper (reference provenance, the report's "pipeline commit")."""

from __future__ import annotations

import subprocess


def _git(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None


def head_commit() -> str | None:
    """HEAD of the checkout we run in; None outside a git checkout or without git."""
    out = _git("rev-parse", "HEAD")
    return out.stdout.strip() if out is not None and out.returncode == 0 else None


def describe_commit() -> str:
    """HEAD, noting uncommitted changes to tracked files; "n/a" where there is no commit to name."""
    head = head_commit()
    if head is None:
        return "n/a"
    status = _git("status", "--porcelain", "--untracked-files=no")
    dirty = status is not None and status.stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")
