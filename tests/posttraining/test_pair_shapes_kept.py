"""Gate 5 reads each pair file's shape once per version of the file: a later quote of the same
bytes opens the file (so a file gone, moved outside the allowed roots or changed answers as at
its first read) and reads none of it; a changed file, its modification time set back or not, is
read again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, SftStep
from ito_assets.posttraining import fixtures, plan

PAIRS = "".join(f'{{"pair_id": "p{i}", "prompt": "max 371=", "response": "7"}}\n' for i in range(8)).encode()


def step_for(path: Path, data: bytes, *, sha256: str | None = None) -> SftStep:
    path.write_bytes(data)
    return SftStep(kind="sft", data={"uri": f"file://{path}", "sha256": sha256 or hashlib.sha256(data).hexdigest(),
                                     "license": "CC0-1.0", "format": "jsonl"})


@pytest.fixture(autouse=True)
def reads(monkeypatch) -> list[str]:
    """The files read through, by uri; the kept shapes emptied for each test, and a file's identity
    a promise however recently it changed (the racy window: its own test, below)."""
    monkeypatch.setattr(plan, "_known_shapes", type(plan._known_shapes)())
    monkeypatch.setattr(fixtures, "RACY_NS", 0)
    read: list[str] = []
    lines_of = fixtures._lines_of

    def counting(file, uri):
        read.append(uri)
        return lines_of(file, uri)

    monkeypatch.setattr(fixtures, "_lines_of", counting)
    return read


def test_a_second_quote_of_the_same_bytes_reads_none_of_them(tmp_path, reads):
    step = step_for(tmp_path / "sft.jsonl", PAIRS)
    first = plan.read_pair_shapes([step], tmp_path)
    assert plan.read_pair_shapes([step], tmp_path) == first and first["sft"].num_pairs == 8
    assert len(reads) == 1


def test_a_changed_file_is_read_again_even_with_its_times_set_back(tmp_path, reads):
    path = tmp_path / "sft.jsonl"
    step = step_for(path, PAIRS)
    plan.read_pair_shapes([step], tmp_path)
    status = os.stat(path)
    path.write_bytes(PAIRS.replace(b"max 371", b"max 372"))  # the same size
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    with pytest.raises(ItoError) as caught:
        plan.read_pair_shapes([step], tmp_path)
    assert caught.value.code is ErrorCode.SOURCE_DIGEST_MISMATCH and len(reads) == 2


def test_a_kept_shape_is_no_answer_for_a_file_gone_or_outside_the_roots(tmp_path, reads):
    path = tmp_path / "sft.jsonl"
    step = step_for(path, PAIRS)
    plan.read_pair_shapes([step], tmp_path, allowed=lambda p: True)
    with pytest.raises(ItoError) as caught:
        plan.read_pair_shapes([step], tmp_path, allowed=lambda p: False)
    assert caught.value.code is ErrorCode.DATA_POLICY_VIOLATION
    path.unlink()
    with pytest.raises(ItoError) as caught:
        plan.read_pair_shapes([step], tmp_path)
    assert caught.value.code is ErrorCode.SOURCE_NOT_FOUND and len(reads) == 1


@pytest.mark.parametrize(("batch_size", "refused"), [(8, False), (9, True)])
def test_a_kept_shape_still_holds_one_batch_or_is_refused(tmp_path, reads, batch_size, refused):
    step = step_for(tmp_path / "sft.jsonl", PAIRS)
    plan.read_pair_shapes([step.model_copy(update={"batch_size": 1})], tmp_path)
    bigger = step.model_copy(update={"batch_size": batch_size})
    if refused:
        with pytest.raises(ItoError, match="holds 8 pairs, fewer than one batch of 9") as caught:
            plan.read_pair_shapes([bigger], tmp_path)
        assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    else:
        assert plan.read_pair_shapes([bigger], tmp_path)["sft"].num_pairs == 8
    assert len(reads) == 1


def test_a_refused_file_is_not_kept(tmp_path, reads):
    step = step_for(tmp_path / "sft.jsonl", PAIRS, sha256="0" * 64)
    for _ in range(2):
        with pytest.raises(ItoError):
            plan.read_pair_shapes([step], tmp_path)
    assert len(reads) == 2


def test_the_oldest_shape_goes_first_once_the_most_are_kept(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(plan, "KNOWN_SHAPES_MAX", 2)
    steps = [step_for(tmp_path / f"sft{i}.jsonl", PAIRS) for i in range(3)]
    for step in steps[:2]:
        plan.read_pair_shapes([step], tmp_path)
    plan.read_pair_shapes([steps[0]], tmp_path)  # kept, and now the newest
    assert len(reads) == 2
    plan.read_pair_shapes([steps[2]], tmp_path)  # the third: the second, the oldest, goes
    plan.read_pair_shapes([steps[0]], tmp_path)
    assert len(reads) == 3
    plan.read_pair_shapes([steps[1]], tmp_path)
    assert len(reads) == 4


def test_a_file_changed_within_the_racy_window_is_not_kept(tmp_path, reads, monkeypatch):
    """Its times may be too coarse to show a same-size rewrite that follows the read."""
    monkeypatch.setattr(fixtures, "RACY_NS", 3_600 * 10**9)
    step = step_for(tmp_path / "sft.jsonl", PAIRS)
    for _ in range(2):
        plan.read_pair_shapes([step], tmp_path)
    assert len(reads) == 2


def test_the_same_bytes_under_another_digest_or_kind_are_read_again(tmp_path, reads):
    path = tmp_path / "sft.jsonl"
    step = step_for(path, PAIRS)
    plan.read_pair_shapes([step], tmp_path)
    wrong = step.model_copy(update={"data": step.data.model_copy(update={"sha256": "0" * 64})})
    with pytest.raises(ItoError) as caught:
        plan.read_pair_shapes([wrong], tmp_path)
    assert caught.value.code is ErrorCode.SOURCE_DIGEST_MISMATCH
    as_preferences = DpoStep(kind="dpo", data=step.data.model_dump())
    with pytest.raises(ItoError) as caught:
        plan.read_pair_shapes([as_preferences], tmp_path)  # instruction pairs are no preference pairs
    assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID and len(reads) == 3


def test_a_file_whose_identity_moved_while_it_was_read_is_not_kept(tmp_path, reads, monkeypatch):
    path = tmp_path / "sft.jsonl"
    step = step_for(path, PAIRS)
    lines_of = fixtures._lines_of

    def touched(file, uri):
        os.chmod(path, 0o640)  # its change time moves; its bytes do not
        return lines_of(file, uri)

    monkeypatch.setattr(fixtures, "_lines_of", touched)
    plan.read_pair_shapes([step], tmp_path)
    monkeypatch.setattr(fixtures, "_lines_of", lines_of)
    read = []
    monkeypatch.setattr(fixtures, "_lines_of", lambda file, uri: read.append(uri) or lines_of(file, uri))
    plan.read_pair_shapes([step], tmp_path)
    plan.read_pair_shapes([step], tmp_path)
    assert len(read) == 1  # read again once, then kept
