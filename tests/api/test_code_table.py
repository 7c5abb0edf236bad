"""The code table of docs/api.md is the catalogue: every code once, with the status the API answers it
with and its default retryability."""

from __future__ import annotations

import re
from pathlib import Path

from ito_assets.api.routes.common import _STATUS
from ito_assets.errors import RETRYABLE, ErrorCode

CODE_TABLE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
_ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| (\d{3}|-) \| (yes|no) \| .+ \|$")


def _table() -> dict[str, tuple[str, str]]:
    section = CODE_TABLE.read_text().split("\n## Error codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [_ROW.match(line) for line in section.splitlines() if line.startswith("| `")]
    assert all(rows), "a row of the code table is malformed"
    codes = [row.group(1) for row in rows]
    assert len(codes) == len(set(codes)), "a code is listed twice"
    return {row.group(1): (row.group(2), row.group(3)) for row in rows}


def test_every_code_is_listed_once_and_nothing_else() -> None:
    assert set(_table()) == {code.value for code in ErrorCode}


def test_the_listed_status_is_the_one_the_api_answers() -> None:
    for name, (status, _) in _table().items():
        code = ErrorCode(name)
        if status == "-":
            assert code not in _STATUS, f"{name} has an API status; the table must show it"
        else:
            assert _STATUS.get(code, 400) == int(status), name


def test_the_listed_retryability_is_the_default() -> None:
    for name, (_, retryable) in _table().items():
        assert (ErrorCode(name) in RETRYABLE) is (retryable == "yes"), name
