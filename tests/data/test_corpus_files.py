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


def _unreadable(path: Path, monkeypatch) -> None:
    """`path` made unreadable to this process: its mode, and where that does not bind (root), an
    open that refuses it as the kernel would (EACCES)."""
    import builtins
    import errno
    import io
    import os

    path.chmod(0)
    if os.access(path, os.R_OK):
        real = builtins.open

        def refusing(file, *args, **kwargs):
            if os.fspath(file) == os.fspath(path):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(file))
            return real(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", refusing)
        monkeypatch.setattr(io, "open", refusing)


def test_a_file_this_user_cannot_read_is_source_invalid_by_its_position(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "two"}\n')
    _unreadable(tmp_path / "b.jsonl", monkeypatch)
    with pytest.raises(ItoError) as refused:
        describe(find_files([str(tmp_path / "*.jsonl")]))
    assert refused.value.code is ErrorCode.SOURCE_INVALID
    assert refused.value.message == "corpus file #2 cannot be read (permission denied)"


def test_a_path_that_is_not_utf8_is_source_invalid_before_a_manifest_is_written(tmp_path: Path) -> None:
    # Such a name reaches Python with lone surrogates, which no manifest (UTF-8 JSON) can hold:
    # it was the schema's MANIFEST_INVALID "at: <root>", naming nothing.
    with open(bytes(tmp_path) + b"/caf\xe9.jsonl", "wb") as handle:
        handle.write(b'{"text": "one"}\n')
    with pytest.raises(ItoError) as refused:
        describe(find_files([str(tmp_path / "*.jsonl")]))
    assert refused.value.code is ErrorCode.SOURCE_INVALID
    assert refused.value.message == "corpus file #1 has a path that is not UTF-8 text; rename it"


def _prepare(tmp_path: Path, monkeypatch, *flags: str) -> dict:
    """`ito data prepare` on a copy of the forum posts; what it refused, and that it ran nothing."""
    state = tmp_path / "state"
    monkeypatch.setenv("ITO_STATE_DIR", str(state))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    shutil.copyfile(FORUM, tmp_path / "forum.jsonl")
    argv = ["data", "prepare", "--corpus", str(tmp_path / "forum.jsonl"), "--eval-suite", str(SUITE), *flags, "--json"]
    document, status = run(argv)
    assert status != 0 and not document["ok"], json.dumps(document)
    assert not (tmp_path / "dagster").exists()  # refused before any run
    return document["error"]


def test_an_eval_suite_this_user_cannot_read_is_eval_suite_invalid(tmp_path: Path, monkeypatch) -> None:
    suite = tmp_path / "suite.jsonl"
    shutil.copyfile(SUITE, suite)
    _unreadable(suite, monkeypatch)
    error = _prepare(tmp_path, monkeypatch, "--eval-suite", str(suite))
    assert error["code"] == "EVAL_SUITE_INVALID" and error["message"] == "the eval suite file cannot be read (permission denied)"


def test_an_out_that_cannot_be_made_is_refused_before_the_job_runs(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a-file").write_text("x")
    # It was INTERNAL_ERROR once the job had run and its copies were made.
    error = _prepare(tmp_path, monkeypatch, "--out", str(tmp_path / "a-file" / "out"))
    assert error == {"code": "USAGE_ERROR", "message": "--out must name a new or empty folder; a file stands in its path", "retryable": False}
    import os

    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as for a folder of another user
    error = _prepare(tmp_path, monkeypatch, "--out", str(tmp_path / "new" / "out"))
    assert error["code"] == "USAGE_ERROR" and error["message"] == "--out cannot be made: this user cannot write to the folder above it"


def _unlistable(folder: Path, monkeypatch) -> None:
    """`folder` made unlistable to this process: its mode, and where that does not bind (root), a
    scandir that refuses it as the kernel would (glob and the check both list through it)."""
    import errno
    import os

    folder.chmod(0)
    real = os.scandir

    def refusing(path=".", *args):
        if os.path.abspath(os.fspath(path)) == str(folder):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real(path, *args)

    monkeypatch.setattr(os, "scandir", refusing)


@pytest.mark.parametrize("pattern", ["**/*.jsonl", "*/*.jsonl", "locked/*.jsonl", "l*/**"])
def test_a_folder_a_glob_cannot_list_is_refused_not_passed_over(tmp_path: Path, monkeypatch, pattern: str) -> None:
    # glob skips such a folder in silence: its files were left out of the corpus, and counted nowhere.
    for name in ("locked", "open", ".hidden-locked"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.jsonl").write_text(f'{{"text": "{name}"}}\n')
    _unlistable(tmp_path / ".hidden-locked", monkeypatch)  # which no pattern here reaches
    assert [p.name for p in find_files([str(tmp_path / "open" / "*.jsonl"), str(tmp_path / "*" / "o*.jsonl")])] == ["open.jsonl"]
    _unlistable(tmp_path / "locked", monkeypatch)
    with pytest.raises(ItoError) as refused:
        find_files([str(tmp_path / "open" / "*.jsonl"), str(tmp_path / pattern)])
    assert refused.value.code is ErrorCode.SOURCE_INVALID
    assert refused.value.message == "--corpus #2 reaches a folder this user cannot list (permission denied): the files in it would be left out"
    assert [p.name for p in find_files([str(tmp_path / "o*" / "*.jsonl")])] == ["open.jsonl"]  # it reaches no locked folder
