"""The one error type of a config check, and how the Snakefile stops on one: the message alone, no Python frames."""

from __future__ import annotations

import contextlib
import sys


class ConfigError(ValueError):
    """A config value is wrong; the message names the field and the fix."""


@contextlib.contextmanager
def stop_on_config_error():
    """Around the Snakefile's config reading: a ConfigError ends Snakemake with its message alone. Snakemake prints
    any exception raised in a Snakefile with its Python frames ("File .../schema.py, line 199"), which say nothing to
    someone fixing a config value; SystemExit passes through it."""
    try:
        yield
    except ConfigError as exc:
        print(f"amprepro: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
