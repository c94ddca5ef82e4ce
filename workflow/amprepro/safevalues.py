"""What a config value that reaches a command line or a path may look like (docs/config.md lists every such place).

A value that could be read as an option (a leading `-`), a git transport that runs commands (`ext::`), or a ref that
git would parse as something else is refused here, before any command sees it. No torch, no git: this runs at DAG
build time (amprepro.config) and again where the value is used (amprepro.env.apexbuild.source).
"""

from __future__ import annotations

import re

# https, ssh and file URLs, or scp-like user@host:path; the character after the scheme may not start an option.
GIT_URL = re.compile(r"(?:(?:https|ssh|file)://|[A-Za-z0-9._-]+@[A-Za-z0-9][A-Za-z0-9.-]*:)[^\s\-][^\s]*\Z")
# A tag, a branch (optionally under refs/) or a hex commit: git check-ref-format's rules, narrowed to plain characters.
GIT_REF = re.compile(r"(?![-./])(?!.*(?:\.\.|//|/\.|\.lock(?:/|\Z)))[A-Za-z0-9._/+-]{1,200}(?<![./])\Z")
HEX_COMMIT = re.compile(r"[0-9a-f]{7,40}\Z")
MAX_PATH = 4096
# The config fields apex.source and apex.* that name a path.
APEX_PATH_FIELDS = (("source", "path"), ("source", "tarball"), ("cache_dir",))


def git_url_problem(url: str) -> str | None:
    if not isinstance(url, str) or not GIT_URL.match(url):
        return ("is not an https://, ssh:// or file:// URL or user@host:path (other git transports, such as ext::, "
                "can run commands, and a value starting with '-' would be read as an option)")
    return None


def git_ref_problem(ref: str) -> str | None:
    if not isinstance(ref, str) or not GIT_REF.match(ref):
        return ("is not a tag, branch or commit name (letters, digits and . _ / + -, not starting with '-', '.' or "
                "'/', no '..', at most 200 characters)")
    return None


def commit_problem(commit: str) -> str | None:
    if not isinstance(commit, str) or not HEX_COMMIT.match(commit):
        return "is not a commit id (7 to 40 lower-case hex digits)"
    return None


def path_problem(path: str) -> str | None:
    if not isinstance(path, str) or not path:
        return "is not a path"
    if path.startswith("-"):
        return "starts with '-' (it would be read as an option); prefix it with ./"
    if any(ord(char) < 32 for char in path):
        return "contains a control character (newline, tab, NUL ...)"
    if len(path) > MAX_PATH:
        return f"is {len(path)} characters long (at most {MAX_PATH})"
    return None


def apex_problems(apex: dict) -> list[tuple[str, str]]:
    """(field under apex, problem) for every apex value that would reach git or a path in a form we refuse."""
    source = apex.get("source") or {}
    checks = [(("source", "url"), git_url_problem), (("source", "ref"), git_ref_problem),
              (("source", "commit"), commit_problem)]
    checks += [(fields, path_problem) for fields in APEX_PATH_FIELDS]
    problems = []
    for fields, check in checks:
        value = (source if fields[0] == "source" else apex).get(fields[-1])
        if value is not None and (problem := check(value)):
            problems.append((".".join(fields), f"{shorten(value)} {problem}"))
    return problems


def shorten(value, limit: int = 200) -> str:
    """repr(value), cut to about `limit` characters: a message stays readable whatever the value."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
