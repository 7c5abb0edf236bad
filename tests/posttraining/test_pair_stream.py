"""`stream_bound_pairs` (gate 5's reader: a line at a time) answers exactly what `read_bound_pairs`
(the stage's: the whole file, then parsed) answers, for every file, in bounded memory."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from ito_assets.errors import ItoError
from ito_assets.manifest.schema import DpoStep, SftStep
from ito_assets.posttraining.fixtures import read_bound_pairs, stream_bound_pairs

GOOD = '{"pair_id": "p%d", "prompt": "max 371=", "response": "7"}'


def step_for(path: Path, data: bytes, *, kind: str = "sft", sha256: str | None = None):
    path.write_bytes(data)
    reference = {"uri": f"file://{path}", "sha256": sha256 or hashlib.sha256(data).hexdigest(), "license": "CC0-1.0",
                 "format": "jsonl"}
    return (SftStep if kind == "sft" else DpoStep)(kind=kind, data=reference)


def outcome(read) -> tuple:
    try:
        return ("ok", read())
    except ItoError as refused:
        return (refused.code, refused.message)


def both(step, root: Path) -> tuple[tuple, tuple]:
    def streamed():
        seen = []
        stream_bound_pairs(step, root, seen.append)
        return seen
    return outcome(lambda: read_bound_pairs(step, root)), outcome(streamed)


LINES = [GOOD % i for i in range(3)]
CASES = {
    "valid": "\n".join(LINES) + "\n",
    "no last newline": "\n".join(LINES),
    "crlf": "\r\n".join(LINES) + "\r\n",
    "u2028 in a string": '{"pair_id": "a", "prompt": "x\u2028y", "response": "z"}\n',
    "empty": "",
    "one newline": "\n",
    "blank line": LINES[0] + "\n\n" + LINES[1] + "\n",
    "not json": LINES[0] + "\n{\"pair_id\": \n",
    "repeated key": '{"pair_id": "a", "pair_id": "b", "prompt": "p", "response": "r"}\n',
    "wrong fields": '{"pair_id": "a", "prompt": "p"}\n',
    "lone surrogate": '{"pair_id": "a", "prompt": "\\ud800", "response": "r"}\n',
    "bom": "\ufeff" + LINES[0] + "\n",
    "array": "[1, 2]\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("digest", ["right", "wrong"])
def test_every_file_gets_the_stages_answer(tmp_path: Path, name: str, digest: str) -> None:
    step = step_for(tmp_path / "pairs.jsonl", CASES[name].encode(), sha256=None if digest == "right" else "0" * 64)
    stage, gate = both(step, tmp_path)
    assert gate == stage


def test_bytes_that_are_not_utf8_win_over_an_earlier_line_that_is_not_a_pair(tmp_path: Path) -> None:
    data = b"{not json\n" + (GOOD % 1).encode() + b"\n\xff\xfe\n"
    stage, gate = both(step_for(tmp_path / "pairs.jsonl", data), tmp_path)
    assert gate == stage and "is not UTF-8" in gate[1]


def test_preference_pairs_and_missing_or_odd_files(tmp_path: Path) -> None:
    line = '{"pair_id": "a", "prompt": "p", "chosen": "c", "rejected": "r"}\n'
    step = step_for(tmp_path / "dpo.jsonl", line.encode(), kind="dpo")
    stage, gate = both(step, tmp_path)
    assert gate == stage and gate[0] == "ok"
    os.unlink(tmp_path / "dpo.jsonl")
    assert both(step, tmp_path)[1] == both(step, tmp_path)[0] and both(step, tmp_path)[1][0].value == "SOURCE_NOT_FOUND"
    os.mkfifo(tmp_path / "dpo.jsonl")  # a FIFO no one writes: refused at once, never waited on
    assert both(step, tmp_path)[1][0].value == "SOURCE_NOT_FOUND"
    os.unlink(tmp_path / "dpo.jsonl")
    (tmp_path / "dpo.jsonl").mkdir()
    assert both(step, tmp_path)[1][0].value == "SOURCE_NOT_FOUND"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([GOOD % 0, GOOD % 1, "", "{", '"x"', '{"pair_id": "a"}', "\udcff", "é", "\ufeff{}"]),
                max_size=6), st.booleans())
def test_any_mix_of_lines_gets_the_stages_answer(tmp_path_factory, lines: list[str], newline: bool) -> None:
    root = tmp_path_factory.mktemp("mix")
    data = ("\n".join(lines) + ("\n" if newline else "")).encode("utf-8", "surrogateescape")
    stage, gate = both(step_for(root / "pairs.jsonl", data), root)
    assert gate == stage


def test_a_large_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """30 MB of pairs: the stage's reader holds the file and its pairs; gate 5's holds a line."""
    line = json.dumps({"pair_id": "p", "prompt": "x" * 2000, "response": "y" * 1000}) + "\n"
    step = step_for(tmp_path / "big.jsonl", line.encode() * 10_000)
    count = [0]

    def visit(_pair) -> None:
        count[0] += 1

    tracemalloc.start()
    try:
        stream_bound_pairs(step, tmp_path, visit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count[0] == 10_000 and peak < 1 << 20, peak


@pytest.mark.parametrize("extra, refused", [(0, False), (1, True)])
def test_a_line_longer_than_the_readers_bound_is_refused_without_being_held(tmp_path: Path, monkeypatch,
                                                                             extra: int, refused: bool) -> None:
    """The bound is a line's bytes with its newline; a 16 MiB line would need no model's
    positions, so it is lowered here to keep the test small."""
    from ito_assets.posttraining import fixtures

    line = (json.dumps({"pair_id": "p", "prompt": "x" * 1000, "response": "y"}) + "\n").encode()
    monkeypatch.setattr(fixtures, "MAX_STREAMED_LINE_BYTES", len(line) - extra)
    step = step_for(tmp_path / "long.jsonl", (GOOD % 0 + "\n").encode() + line)
    got = outcome(lambda: stream_bound_pairs(step, tmp_path, lambda pair: None))
    if not refused:
        assert got[0] == "ok"
        return
    assert got[0].value == "POSTTRAINING_DATA_INVALID" and "line 2 is longer than" in got[1]


def test_a_file_with_no_newline_is_read_in_bounded_memory(tmp_path: Path, monkeypatch) -> None:
    from ito_assets.posttraining import fixtures

    monkeypatch.setattr(fixtures, "MAX_STREAMED_LINE_BYTES", 1 << 20)
    step = step_for(tmp_path / "one-line.jsonl", b"x" * (40 << 20))  # 40 MiB, no newline
    tracemalloc.start()
    try:
        got = outcome(lambda: stream_bound_pairs(step, tmp_path, lambda pair: None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got[0].value == "POSTTRAINING_DATA_INVALID" and peak < 4 << 20, peak


def test_a_file_outside_what_is_allowed_is_not_read(tmp_path: Path) -> None:
    step = step_for(tmp_path / "pairs.jsonl", (GOOD % 0 + "\n").encode())
    seen = []
    got = outcome(lambda: stream_bound_pairs(step, tmp_path, seen.append, allowed=lambda path: False))
    assert got[0].value == "DATA_POLICY_VIOLATION" and seen == []
    assert outcome(lambda: stream_bound_pairs(step, tmp_path, seen.append,
                                              allowed=lambda path: path.parent == tmp_path.resolve()))[0] == "ok"
