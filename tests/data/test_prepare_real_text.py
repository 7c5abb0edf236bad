"""`ito data prepare` on what real corpora bring: files compressed in a way the reader does not
open, and eval suites whose short items the scan cannot look for. Generated in tmp_path; no
Dagster run (the summary is built from the stage outputs it is handed)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import zipfile
from pathlib import Path

import pytest

from ito_assets.data import corpus
from ito_assets.errors import ErrorCode, ItoError

LINE = b'{"id": "a", "text": "the quick brown fox"}\n'


def _zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("part.jsonl", LINE)


@pytest.mark.parametrize(("name", "write"), [
    ("xz", lambda p: p.write_bytes(lzma.compress(LINE))),
    ("bzip2", lambda p: p.write_bytes(bz2.compress(LINE))),
    ("zip", _zip),
])
def test_a_container_the_reader_does_not_open_is_refused_by_name(tmp_path, name, write) -> None:
    """Read as JSONL, its bytes were refused only after the job ran, as "line 1 is not UTF-8 text"."""
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(LINE)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(LINE + LINE))
    packed = tmp_path / "c.jsonl.packed"
    write(packed)
    with pytest.raises(ItoError) as refused:
        corpus.describe([plain, tmp_path / "b.jsonl.gz", packed])
    assert refused.value.code is ErrorCode.SOURCE_INVALID
    assert f"corpus file #3 is {name}-compressed" in refused.value.message and "gzip or zstd" in refused.value.message
    assert [f.format for f in corpus.describe([plain, tmp_path / "b.jsonl.gz"])] == ["jsonl", "jsonl"]
