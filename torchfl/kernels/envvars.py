"""torchfl's environment variables, read one way.

Why: each reader had its own ``not in ("", "0", "false", "no", "off")``, so a typo such as
``TORCHFL_STRICT=maybe`` silently meant "on" and ``TORCHFL_COMPILE_HELPERS=abc`` silently
meant the default. Here a yes/no variable is 1/0, true/false, yes/no or on/off (any case,
spaces ignored); unset or empty is its default; anything else raises :class:`EnvError`
naming the variable and what it takes. The lowest layer that reads one (the kernels' compile
helpers) holds it; the runtime reads through it too.
"""
from __future__ import annotations

import os

__all__ = ["EnvError", "flag", "count"]

YES = ("1", "true", "yes", "on")
NO = ("0", "false", "no", "off")


class EnvError(ValueError):
    """An environment variable holds a value torchfl does not read."""


def flag(name: str, default: bool = False) -> bool:
    """The yes/no variable ``name`` (``default`` when unset or empty)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in YES:
        return True
    if value in NO:
        return False
    raise EnvError(f"{name}={raw!r} is not a yes/no value: set it to 1 or 0 (true/false, yes/no and on/off "
                   f"work too), or unset it")


def count(name: str, default: int) -> int:
    """The count variable ``name``: a number, 0 or a "no" word for none, ``default`` when unset."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in NO:
        return 0
    if value.isdigit():
        return int(value)
    raise EnvError(f"{name}={raw!r} is not a count: set a number (0 or off for none), or unset it for "
                   f"the default ({default})")
