"""Strict JSON decoding for reviewed files: exactly one UTF-8 JSON document and nothing else.

Python's json module accepts duplicate keys (last wins), NaN/Infinity (also spelled 1e400) and
a leading BOM via utf-8-sig; each of those lets two readers see different content, so each is
refused here.
"""

from __future__ import annotations

import json
import math
from typing import Any

_BOM = b"\xef\xbb\xbf"
_MAX_DEPTH = 32  # far beyond any manifest; bounds recursion in the secret scan and validators


class StrictJsonError(ValueError):
    """Why the bytes are not one strict JSON document; never carries the input."""


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise StrictJsonError("duplicate object key")
        seen[key] = value
    return seen


def _reject_constant(_name: str) -> Any:
    raise StrictJsonError("NaN and Infinity are not JSON numbers")


def _finite_float(text: str) -> float:
    # 1e400 parses as inf: Infinity by another name, so it is refused like Infinity.
    value = float(text)
    if not math.isfinite(value):
        raise StrictJsonError("a number is out of a double's range")
    return value


def _depth(value: Any, level: int = 0) -> int:
    if level > _MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def loads_strict(data: bytes) -> Any:
    """Decode `data` as exactly one JSON document (surrounding whitespace allowed)."""
    if data.startswith(_BOM):
        raise StrictJsonError("a byte order mark is not allowed")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise StrictJsonError("not valid UTF-8") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs_without_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except StrictJsonError:
        raise
    except (json.JSONDecodeError, RecursionError):
        # json reports trailing bytes as "Extra data"; positions only, never the text.
        raise StrictJsonError("not a single well-formed JSON document") from None
    except ValueError:
        # An integer past Python's digit limit for int() (4300 digits by default, CVE-2020-10735).
        raise StrictJsonError("a number has too many digits") from None
    if _depth(value) > _MAX_DEPTH:
        raise StrictJsonError("nesting is too deep")
    return value
