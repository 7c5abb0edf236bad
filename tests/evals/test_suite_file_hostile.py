"""The eval suite file under hostile conditions: a path that is no regular file, one the system
cannot read, a file larger than it said it was when its size was checked, a pipe swapped in after
the check, the size bound on both sides, and items whose text is whitespace alone. Each is refused
as EVAL_SUITE_INVALID with a message that names the cause, never an OSError nor a hang."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals import suite as suite_module
from ito_assets.evals.suite import load_suite, parse_suite

ITEM = {"id": "q1", "benchmark": "trivia", "question": "Which keyword defines a function in Python?", "answer": "def"}
LINE = (json.dumps(ITEM) + "\n").encode()


def _refused(path: Path) -> ItoError:
    with pytest.raises(ItoError) as refused:
        load_suite(path)
    assert refused.value.code is ErrorCode.EVAL_SUITE_INVALID
    return refused.value


def test_a_name_the_system_cannot_open_is_eval_suite_invalid_not_an_oserror(tmp_path: Path) -> None:
    # ENAMETOOLONG (a misconfigured ITO_EVAL_SUITE): an OSError the sensor's tick raised whole.
    error = _refused(tmp_path / ("x" * 300 + ".jsonl"))
    assert error.message == "the eval suite file cannot be read (file name too long)"
    os.symlink("loop.jsonl", tmp_path / "loop.jsonl")
    assert _refused(tmp_path / "loop.jsonl").message.startswith("the eval suite file cannot be read (")


def test_a_folder_a_device_or_a_pipe_is_named_as_such_not_as_missing(tmp_path: Path) -> None:
    (tmp_path / "folder.jsonl").mkdir()
    os.symlink("/dev/zero", tmp_path / "zero.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    for name in ("folder.jsonl", "zero.jsonl", "fifo.jsonl"):
        assert _refused(tmp_path / name).message == "the eval suite path is not a regular file (a folder, a device or a pipe)"
    assert _refused(tmp_path / "gone.jsonl").message == "the eval suite file does not exist"
    assert _refused(tmp_path / "folder.jsonl" / "x" / "y.jsonl").message == "the eval suite file does not exist"


def test_a_file_longer_than_its_size_said_is_read_no_further_than_the_bound(monkeypatch) -> None:
    # A file written in place grows after its size was checked; /proc's files show the same thing
    # deterministically: their size reads 0 whatever they hold. What is read is what is bounded.
    monkeypatch.setattr(suite_module, "MAX_SUITE_BYTES", 64)
    status = Path("/proc/self/status")
    assert status.stat().st_size == 0 and len(status.read_bytes()) > 64
    assert "too large" in _refused(status).message


def test_a_pipe_swapped_in_after_the_check_is_refused_without_waiting_for_a_writer(tmp_path: Path, monkeypatch) -> None:
    """The path was a regular file when it was checked and is a pipe by the time it is opened."""
    regular, pipe = tmp_path / "regular.jsonl", tmp_path / "suite.jsonl"
    regular.write_bytes(LINE)
    os.mkfifo(pipe)
    real_stat = os.stat

    def checked_before_the_swap(path, *args, **kwargs):
        return real_stat(regular if os.fspath(path) == os.fspath(pipe) else path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", checked_before_the_swap)
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(load_suite(pipe))
        except ItoError as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked in open() for a writer: give it one, so that the thread ends
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
        pytest.fail("the reader waited on a pipe for a writer")
    (error,) = outcome
    assert isinstance(error, ItoError) and error.code is ErrorCode.EVAL_SUITE_INVALID
    assert error.message == "the eval suite path is not a regular file (a folder, a device or a pipe)"


def test_the_size_bound_holds_at_its_edge_on_both_sides(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "suite.jsonl"
    path.write_bytes(LINE)
    monkeypatch.setattr(suite_module, "MAX_SUITE_BYTES", len(LINE))
    assert [i.id for i in load_suite(path).items] == ["q1"]  # exactly the bound: read
    path.write_bytes(LINE + b"\n")  # one byte over: refused
    assert "too large" in _refused(path).message
    monkeypatch.setattr(suite_module, "MAX_SUITE_BYTES", len(LINE) + 1)
    assert [i.id for i in load_suite(path).items] == ["q1"]


def test_a_file_over_the_real_bound_is_refused_without_being_read(tmp_path: Path) -> None:
    path = tmp_path / "suite.jsonl"
    with open(path, "wb") as handle:
        handle.truncate(suite_module.MAX_SUITE_BYTES + 1)  # sparse: nothing on disk
    assert "too large" in _refused(path).message


@pytest.mark.parametrize("field", ["question", "answer", "benchmark", "id"])
@pytest.mark.parametrize("blank", [" ", "\t\r\n ", "\u00a0", "\u3000\u2028"])
def test_a_field_of_whitespace_alone_is_refused(field: str, blank: str) -> None:
    # A blank question gives decontamination nothing to look for; a blank answer is "matched" by an
    # empty generation (`training.evaluation` compares stripped texts); a blank id names nothing.
    data = LINE + json.dumps({**ITEM, "id": "q2", field: blank}).encode() + b"\n"
    with pytest.raises(ItoError) as refused:
        parse_suite("stem", data)
    assert refused.value.code is ErrorCode.EVAL_SUITE_INVALID and refused.value.message == "eval suite line 2 is not a valid item"


def test_text_around_whitespace_is_kept_as_written() -> None:
    item = {**ITEM, "id": " q1 ", "question": "  Which keyword defines a function?  ", "answer": "\tdef\n"}
    (read,) = parse_suite("stem", json.dumps(item).encode()).items
    assert (read.id, read.question, read.answer) == (item["id"], item["question"], item["answer"])
