"""The one JSON document every `ito` verb prints with --json: one shape for scripts, whatever the verb."""

from __future__ import annotations

import json
from typing import Any

from ito_assets.errors import ItoError


def success(data: dict[str, Any], *, live_api_contacted: bool, notice: str | None = None) -> dict:
    return {"ok": True, "live_api_contacted": live_api_contacted, "notice": notice, "data": data}


def failure(error: ItoError, *, live_api_contacted: bool, notice: str | None = None) -> dict:
    return {
        "ok": False,
        "live_api_contacted": live_api_contacted,
        "notice": notice,
        "error": error.to_dict(),
    }


def dumps(document: dict) -> str:
    # allow_nan=False: the envelope is strict JSON, as callers parse it with strict parsers.
    # ensure_ascii=True (json's default, spelled out because it matters): every non-ASCII
    # character, U+2028/U+2029 and C1 controls included, goes out as a \uXXXX escape, and C0
    # controls are escaped either way, so the envelope is one line of plain ASCII on any terminal.
    return json.dumps(document, sort_keys=True, allow_nan=False, ensure_ascii=True)
