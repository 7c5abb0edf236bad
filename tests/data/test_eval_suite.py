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


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("header", ['{"suite_id": "my-evals-v1"}\n', ""])
def test_a_bom_at_the_start_is_read_past_and_stays_in_the_digest(header: str) -> None:
    """As the corpora's reader takes one; the digest is still the file's bytes (`sha256sum`)."""
    data = BOM + (header + LINES).encode()
    suite = parse_suite("stem", data)
    assert [i.id for i in suite.items] == ["q1"] and suite.suite_id == ("my-evals-v1" if header else "stem")
    assert suite.digest == "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_bom_after_the_start_is_refused() -> None:
    second = {**ITEM, "id": "q2"}
    for data in (LINES.encode() + BOM + json.dumps(second).encode() + b"\n", BOM + BOM + LINES.encode()):
        with pytest.raises(ItoError) as info:
            parse_suite("stem", data)
        assert info.value.code is ErrorCode.EVAL_SUITE_INVALID and "not a valid item" in info.value.message


def test_crlf_lines_still_read_with_or_without_a_bom() -> None:
    crlf = (json.dumps(ITEM) + "\r\n" + json.dumps({**ITEM, "id": "q2"}) + "\r\n").encode()
    for data in (crlf, BOM + crlf):
        suite = parse_suite("stem", data)
        assert [i.id for i in suite.items] == ["q1", "q2"] and suite.digest == "sha256:" + hashlib.sha256(data).hexdigest()


def test_the_committed_suites_digest_is_unchanged() -> None:
    """The digest reviewed manifests bind to: the file's sha256, as before a BOM was read past."""
    path = PROJECT_ROOT / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl"
    assert load_suite(path).digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_suite(path).digest == "sha256:57fb808bb9a7b8e6496a6eb60004da49ad9fb78cdf01c3e3c4b2ae42371298cd"


@pytest.mark.parametrize("length", [255, 256])
def test_an_item_id_is_any_text_up_to_its_bound(length: int) -> None:
    """The bound `ito audit eval-item` shares (MAX_ITEM_ID_CHARS), counted in characters."""
    for item_id in ("ü" * length, "my item/" + "x" * (length - 8), "a\tb" + "y" * (length - 3)):
        assert parse_suite("stem", json.dumps({**ITEM, "id": item_id}).encode()).items[0].id == item_id


def test_an_item_id_over_its_bound_is_refused() -> None:
    with pytest.raises(ItoError):
        parse_suite("stem", json.dumps({**ITEM, "id": "ü" * 257}).encode())


@pytest.mark.parametrize("item_id", ["\x00", "q\x001", "q1\x00"])
def test_an_item_id_with_a_nul_is_refused_since_no_command_line_can_name_it(item_id: str) -> None:
    with pytest.raises(ItoError) as refused:
        parse_suite("stem", json.dumps({**ITEM, "id": item_id}).encode())
    assert refused.value.code is ErrorCode.EVAL_SUITE_INVALID and "\x00" not in refused.value.message
