"""The files `ito data prepare --corpus` names (ito_assets/data/corpus.py): hashed as stored, and
the same bytes twice refused before anything runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ito_assets.api.cli import run
from ito_assets.data.corpus import describe, find_files
from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.settings import PROJECT_ROOT

FORUM = PROJECT_ROOT / "data" / "fixtures" / "corpora" / "forum_posts.jsonl"
SUITE = PROJECT_ROOT / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl"


def test_files_are_hashed_as_stored_in_the_order_given(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"text": "one"}\n')
    b.write_text('{"text": "two"}\n')
    files = describe(find_files([str(tmp_path / "*.jsonl")]))
    assert [(f.path.name, f.sha256, f.format) for f in files] == [("a.jsonl", file_sha256(a), "jsonl"), ("b.jsonl", file_sha256(b), "jsonl")]


def test_the_same_bytes_twice_are_refused_naming_both_positions(tmp_path: Path) -> None:
    # A copied shard: every document twice under one id (an id derives from its file's digest).
    (tmp_path / "other.jsonl").write_text('{"text": "something else"}\n')
    for name in ("part-1.jsonl", "part-3.jsonl"):
        shutil.copyfile(FORUM, tmp_path / name)
    with pytest.raises(ItoError) as refused:
        describe(find_files([str(tmp_path / "part-1.jsonl"), str(tmp_path / "other.jsonl"), str(tmp_path / "part-3.jsonl")]))
    assert refused.value.code is ErrorCode.SOURCE_INVALID
    assert refused.value.message == "corpus files #1 and #3 hold the same bytes; pass one of them"


def test_ito_data_prepare_refuses_a_copied_file_before_it_writes_anything(tmp_path: Path, monkeypatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("ITO_STATE_DIR", str(state))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    for name in ("part-1.jsonl", "part-2.jsonl"):
        shutil.copyfile(FORUM, tmp_path / name)
    document, status = run(["data", "prepare", "--corpus", str(tmp_path / "part-*.jsonl"), "--eval-suite", str(SUITE), "--json"])
    assert status != 0 and document["error"]["code"] == "SOURCE_INVALID", json.dumps(document)
    assert not state.exists() or not any(state.rglob("*.json"))  # no data manifest stored, no run
