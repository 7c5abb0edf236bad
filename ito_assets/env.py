"""How every ITO_ environment variable's text becomes a value: the one integer parsing, the one
number parsing and the one error path, shared by the settings model (settings.py) and the views
built from it (gate policy, server configuration) and by the client's connection settings.

Standard library only: the client imports this at every API call, and its start is timed.
A refused value is never echoed (it may be a secret pasted into the wrong variable).
"""

from __future__ import annotations

import os
from typing import Mapping

from ito_assets.errors import ErrorCode, ItoError

PREFIX = "ITO_"
# int() refuses longer digit strings (sys.int_info.default_max_str_digits); any bound is far below.
_MAX_DIGITS = 4300


def whole_number(text: str) -> int | None:
    """ASCII digits only: int() alone would also take "+1", " 1", "1_000" and other scripts' digits."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS else None


def number(text: str) -> float | None:
    """A decimal number as float() reads it (NaN and infinity included: the bounds refuse them)."""
    try:
        return float(text)
    except ValueError:
        return None


def parse(raw: str | None, *, default, whole: bool, message: str, low: float | None = None,
          high: float | None = None, low_open: bool = False, empty_is_default: bool = True):
    """The value of one variable from its text (None when unset): the default when unset (or empty,
    where `empty_is_default`), else the number within [low, high] ((low, high] when `low_open`).
    A bad value is USAGE_ERROR with `message`, which names the variable, never the value: every
    reader of an ITO_ variable reports it so that a verb prints it, not an internal error."""
    if raw is None or (empty_is_default and not raw):
        return default
    value = whole_number(raw) if whole else number(raw)
    if value is None or (low is not None and not (low < value if low_open else low <= value)) \
            or (high is not None and not value <= high):
        raise ItoError(ErrorCode.USAGE_ERROR, message)
    return value


def environment(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The mapping the settings are read from: the process environment unless one is given."""
    return os.environ if env is None else env
