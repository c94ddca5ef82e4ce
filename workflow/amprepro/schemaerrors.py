"""One way to turn a jsonschema failure into a message that names the field: config, claims and reference files.

The message is length-bounded because a schema message quotes the bad value, and a huge value must not print megabytes.
"""

from __future__ import annotations

from collections.abc import Callable

import jsonschema

MAX_MESSAGE = 400  # characters of a schema message


def first_error(validator: jsonschema.protocols.Validator, instance) -> jsonschema.ValidationError | None:
    """The error to report, or None: the shallowest one, or for a oneOf/anyOf the branch that got furthest."""
    errors = sorted(validator.iter_errors(instance), key=lambda e: (depth(e), str(e.absolute_path)))
    if not errors:
        return None
    error = errors[0]
    leaf = max(error.context, key=depth, default=None) if error.context else None
    return leaf if leaf is not None and depth(leaf) >= depth(error) else error


def depth(error: jsonschema.ValidationError) -> int:
    return len(list(error.absolute_path))


def field_name(error: jsonschema.ValidationError, prefix: str = "",
               label: Callable[[list], str] | None = None) -> str:
    """prefix.key[index].key..., each step followed by label(path so far) when given; "(top level)" for the root."""
    parts, text = list(error.absolute_path), prefix
    for i, part in enumerate(parts):
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
        if label:
            text += label(parts[: i + 1])
    return text.lstrip(".") or "(top level)"


def bounded_message(error: jsonschema.ValidationError) -> str:
    message = error.message
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + " ..."
