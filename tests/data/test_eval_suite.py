"""The eval suite's id: declared by the file's first line, else the file's stem (the committed
suite, which reviewed manifests name so); its digest covers the whole file, header included."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import load_suite, parse_suite
from ito_assets.settings import PROJECT_ROOT

ITEM = {"id": "q1", "benchmark": "trivia", "question": "Which keyword defines a function in Python?", "answer": "def"}
LINES = json.dumps(ITEM) + "\n"


def test_the_first_line_declares_the_id_whatever_the_file_is_called(tmp_path: Path) -> None:
    path = tmp_path / "anything at all.jsonl"
    data = '{"suite_id": "my-evals-v1"}\n' + LINES
    path.write_text(data)
    suite = load_suite(path)
    assert suite.suite_id == "my-evals-v1" and [i.id for i in suite.items] == ["q1"]
    assert suite.digest == "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def test_without_a_header_the_stem_is_the_id_as_before() -> None:
    suite = load_suite(PROJECT_ROOT / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl")
    assert suite.suite_id == "ito-fixture-evals-v1" and len(suite.items) == 205


@pytest.mark.parametrize("header", [
    '{"suite_id": "has space"}',
    '{"suite_id": 7}',
    '{"suite_id": "ok", "extra": 1}',
    '{"suite_id": ""}',
])
def test_a_bad_header_is_refused(header: str) -> None:
    with pytest.raises(ItoError) as info:
        parse_suite("stem", (header + "\n" + LINES).encode())
    assert info.value.code is ErrorCode.EVAL_SUITE_INVALID and "header" in info.value.message


def test_a_header_only_comes_first() -> None:
    with pytest.raises(ItoError) as info:
        parse_suite("stem", (LINES + '{"suite_id": "late"}\n').encode())
    assert info.value.code is ErrorCode.EVAL_SUITE_INVALID and "line 2" in info.value.message
    with pytest.raises(ItoError):
        parse_suite("stem", b'{"suite_id": "a"}\n{"suite_id": "b"}\n' + LINES.encode())
    with pytest.raises(ItoError) as info:
        parse_suite("stem", b'{"suite_id": "only-a-header"}\n')
    assert "no items" in info.value.message
