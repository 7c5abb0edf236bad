"""Listings that page (`ito logs`, `metrics`, `checkpoints`, `runs list`): what a page's readable
output says is left, and `--all`, which follows the cursor to the end.

Every paged answer carries `next_after` (the cursor for the next page, null on the last one) and
`num_total` (the entries in all when the page was read); an older server may send no total.
"""

from __future__ import annotations

import time
from typing import Callable

# --all asks for pages this large (the server's most): few requests, each answer bounded.
ALL_PAGE = 500


def is_time_key(key: str) -> bool:
    """Whether the API's number under `key` is epoch seconds (`at`, and every `*_at`: created_at,
    expires_at, consumed_at, ...), shown as ISO 8601 UTC in readable output."""
    return key == "at" or key.endswith("_at")


def iso_utc(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def shown_value(key: str, value: object) -> object:
    if is_time_key(key) and isinstance(value, int) and not isinstance(value, bool):
        try:
            return iso_utc(value)
        except (OverflowError, OSError, ValueError):  # beyond the platform's calendar: the number itself
            return value
    return value


def readable_line(key: str, value: object) -> str:
    """`key: value` as a person reads it: times in ISO 8601 UTC, and true, false, null, lists and
    objects as in the JSON output (nested times included), never Python's spelling of them."""
    return f"{key}: {_readable(key, value)}"


def _readable(key: str, value: object) -> str:
    import json

    shown = _times_shown(key, value)
    return shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False)


def _times_shown(key: str, value: object) -> object:
    if isinstance(value, dict):
        return {k: _times_shown(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times_shown(key, v) for v in value]
    return shown_value(key, value)


def count_phrase(num_shown: int, num_total: int | None, noun: str) -> str:
    """`463 entries`, or `100 of 463 entries` when the page holds fewer than there are."""
    if num_total is None or num_total == num_shown:
        return f"{num_shown} {noun}"
    return f"{num_shown} of {num_total} {noun}"


def more_lines(num_shown: int, num_total: int | None, cursor: object) -> list[str]:
    """The last line of a page that is not the last one: how to read what is left."""
    if cursor is None:
        return []
    if num_total is None:
        return [f"{num_shown} shown, more after {cursor}: --after {cursor} or --all"]
    return [f"{num_shown} of {num_total} shown: --after {cursor} for the next page, or --all"]


def follow(get: Callable[[object], dict], first_after: object, key: str) -> dict:
    """Every page from `first_after` on, merged into one answer of the same shape: all the
    items, their count, the last page's other fields and no cursor. A cursor that comes back
    twice ends the walk (an older server repeats the last one instead of sending null)."""
    data = get(first_after)
    items, seen = list(data.get(key, [])), {first_after}
    while data.get("next_after") is not None and data["next_after"] not in seen:
        seen.add(data["next_after"])
        data = get(data["next_after"])
        items.extend(data.get(key, []))
    return {**data, key: items, f"num_{key}": len(items), "next_after": None}
