"""`--corpus` globs: the files `glob.glob(pattern, recursive=True)` names, found by a walk that ends
on a folder tree with links back up it (glob's `**` follows them for ever, its memory growing)."""

from __future__ import annotations

import glob
import os
import string
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from ito_assets.data.corpus import find_files
from ito_assets.errors import ErrorCode, ItoError

PATTERNS = ["**/*.jsonl", "**", "*/*.jsonl", "*/**/*.jsonl", "**/b*/*", "?/*", "[ab]*/**/*.j*", ".*/*", "**/.*",
            "a/**/*.jsonl", "*/[!a]*.jsonl", "**/*/**/x.jsonl", "b/*", "*"]
NAMES = ["a", "b", "ab", ".h", "x.jsonl", "y.jsonl", ".z.jsonl", "b.txt"]


def _finished(patterns: list[str], seconds: float = 20) -> list[Path]:
    """find_files(patterns), failing the test (rather than hanging it) where it does not end."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(files=find_files(patterns)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the walk did not end"
    return result["files"]


def _tree(root: Path, paths: list[tuple[str, ...]]) -> None:
    """Folders and files (a last name with a dot is a file) under `root`."""
    for parts in paths:
        path = root.joinpath(*parts)
        if "." in parts[-1].lstrip("."):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('{"text": "x"}\n')
        else:
            path.mkdir(parents=True, exist_ok=True)


def _globbed(pattern: str) -> list[Path]:
    return list(dict.fromkeys(Path(m).resolve() for m in sorted(glob.glob(pattern, recursive=True)) if Path(m).is_file()))


@settings(max_examples=examples(60, 600), deadline=None)
@given(paths=st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map(tuple), min_size=1, max_size=12),
       pattern=st.sampled_from(PATTERNS), relative=st.booleans())
def test_a_tree_without_loops_names_the_files_glob_names_in_its_order(tmp_path_factory, paths, pattern, relative, monkeypatch_module):
    root = tmp_path_factory.mktemp("tree").resolve()
    # A folder name that is also a file's elsewhere is left out: a path holds one or the other.
    _tree(root, [p for p in paths if all("." not in n.lstrip(".") for n in p[:-1])])
    (root / "elsewhere").mkdir(exist_ok=True)
    _tree(root / "elsewhere", [("linked", "l.jsonl"), ("linked", "m", "k.jsonl")])
    if (root / "a").is_dir() and not (root / "a" / "ln").exists():
        (root / "a" / "ln").symlink_to(root / "elsewhere" / "linked")  # a link to a folder outside: followed
    if relative:
        monkeypatch_module.chdir(root)
        full = pattern
    else:
        full = str(root / pattern)
    expected = _globbed(full)
    if not expected:
        with pytest.raises(ItoError) as refused:
            find_files([full])
        assert refused.value.code is ErrorCode.SOURCE_NOT_FOUND
    else:
        assert find_files([full]) == expected


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("loop", ["self", "mutual", "three to the parent"])
def test_a_loop_of_folder_links_ends_and_names_each_file_once(tmp_path, loop):
    _tree(tmp_path, [("a", "one.jsonl"), ("a", "b", "two.jsonl"), ("c", "three.jsonl")])
    if loop == "self":
        (tmp_path / "a" / "b" / "me").symlink_to(".")
    elif loop == "mutual":
        (tmp_path / "a" / "b" / "to-c").symlink_to(tmp_path / "c")
        (tmp_path / "c" / "to-a").symlink_to(tmp_path / "a")
    else:
        for name in ("l1", "l2", "l3"):
            (tmp_path / "a" / "b" / name).symlink_to("..")
    files = _finished([str(tmp_path / "**" / "*.jsonl")])
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == ["a/b/two.jsonl", "a/one.jsonl", "c/three.jsonl"]
    below_a = [p.name for p in _finished([str(tmp_path / "a" / "**")])]
    assert sorted(below_a) == sorted(["one.jsonl", "two.jsonl"] + (["three.jsonl"] if loop == "mutual" else []))


def test_a_link_to_a_folder_outside_is_followed_and_its_files_named_by_their_real_paths(tmp_path):
    _tree(tmp_path, [("corpus", "own.jsonl"), ("shared", "deep", "theirs.jsonl")])
    (tmp_path / "corpus" / "shared").symlink_to(tmp_path / "shared")
    (tmp_path / "corpus" / "again").symlink_to(tmp_path / "shared")  # the same folder twice: its files once
    files = _finished([str(tmp_path / "corpus" / "**" / "*.jsonl")])
    assert files == [tmp_path / "shared" / "deep" / "theirs.jsonl", tmp_path / "corpus" / "own.jsonl"]


def test_many_links_to_one_folder_are_walked_once_each(tmp_path):
    """Ten levels of two links each to the next level: glob walks 2**10 paths; each folder once here."""
    levels = [tmp_path / f"level{i}" for i in range(11)]
    for level in levels:
        level.mkdir()
    (levels[-1] / "deep.jsonl").write_text('{"text": "x"}\n')
    for upper, lower in zip(levels, levels[1:]):
        for name in string.ascii_lowercase[:2]:
            (upper / name).symlink_to(lower)
    listed: list[str] = []
    real = os.scandir

    def counting(path=".", *args):
        listed.append(os.fspath(path))
        return real(path, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "scandir", counting)
        assert _finished([str(levels[0] / "**" / "*.jsonl")]) == [levels[-1] / "deep.jsonl"]
    assert len(listed) <= 2 * len(levels)  # `**` and `*.jsonl` each list a folder once


def test_a_folder_two_links_reach_is_named_where_glob_names_it(tmp_path):
    # "a-b/l" sorts before "a/l" as strings ("-" before "/"): glob's sorted list reaches the shared
    # file through "a-b" first, and the corpus's first file names the manifest.
    root = tmp_path.resolve()
    (root / "shared").mkdir()
    (root / "shared" / "f.jsonl").write_text('{"text": "x"}\n')
    corpus = root / "corpus"
    for name in ("a", "a-b"):
        (corpus / name).mkdir(parents=True)
        (corpus / name / "l").symlink_to(root / "shared")
    (corpus / "a-c.jsonl").write_text('{"text": "y"}\n')
    pattern = str(corpus / "**" / "*.jsonl")
    expected = list(dict.fromkeys(Path(m).resolve() for m in sorted(glob.glob(pattern, recursive=True))))
    assert find_files([pattern]) == expected == [root / "shared" / "f.jsonl", corpus / "a-c.jsonl"]


@pytest.mark.parametrize("pattern", ["", os.sep, os.sep * 2])
def test_an_empty_pattern_names_no_file(pattern):
    with pytest.raises(ItoError) as caught:
        find_files([pattern])
    assert caught.value.code is ErrorCode.SOURCE_NOT_FOUND
