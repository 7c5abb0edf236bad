"""A corpus of one's own, made ready for the data stage: the files that paths or globs name, each
hashed as stored and its format told from its first bytes, and the data manifest that binds them,
under a licence, to an eval suite by its id and digest (`ito data prepare`).

Messages name a pattern by its position (`--corpus #2`), never by its text: what a caller typed is
not echoed (errors.py).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ito_assets.digests import Digest, file_sha256
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite, is_suite_id
from ito_assets.manifest.schema import DATA_KIND, SCHEMA_VERSION, DecontaminationProvenance

PARQUET_MAGIC = b"PAR1"  # the first (and last) four bytes of every Parquet file
# Containers the reader does not open, by their first bytes: read as JSONL, their bytes would be
# refused as "line 1 is not UTF-8 text", after the job ran, naming no cause.
# A zip starts with a file's header, or, empty, with its end of directory, or, spanned, with a marker.
UNREAD_MAGIC = {"xz": (b"\xfd7zXZ\x00",), "bzip2": (b"BZh",), "lz4": (b"\x04\x22\x4d\x18",),
                "zip": (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"), "7z": (b"7z\xbc\xaf\x27\x1c",)}
# A tar header's magic and version fields at byte 257, POSIX's or GNU's: each holds a NUL, which
# no JSONL text can, so a line that says "ustar" there is never taken for one.
_TAR_MAGICS, _TAR_MAGIC_AT = (b"ustar\x0000", b"ustar  \x00"), 257
# SPDX's word for "no licence was stated": the data policy refuses it until someone states one.
UNSTATED_LICENSE = "NOASSERTION"
DEFAULT_NAME = "corpus"
_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class CorpusFile:
    path: Path  # absolute, symlinks resolved
    sha256: str  # of the bytes as stored (a compressed file is hashed compressed)
    format: str  # "jsonl" (plain, gzip or zstd) or "parquet"
    num_bytes: int

    @property
    def uri(self) -> str:
        return f"file://{self.path}"


def find_files(patterns: Sequence[str]) -> list[Path]:
    """Every regular file the patterns name (a path, or a glob with `**` for any depth), in
    pattern order and then name order, each once. A pattern that names no file is SOURCE_NOT_FOUND."""
    found: dict[Path, None] = {}
    for position, pattern in enumerate(patterns, start=1):
        expanded = os.path.expanduser(pattern)
        # An existing path is taken as it is, so that a file name with [ or * in it is no pattern.
        if os.path.lexists(expanded):
            matches = [expanded]
        else:
            walk = _GlobWalk()
            matches = sorted(walk.matches(expanded))
            if walk.unlisted is not None:
                raise ItoError(ErrorCode.SOURCE_INVALID, f"--corpus #{position} reaches a folder this user cannot list "
                               f"({walk.unlisted}): the files in it would be left out")
        files = [Path(m).resolve() for m in matches if Path(m).is_file()]
        if not files:
            raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"--corpus #{position} names no file (a folder needs a glob, such as DIR/*.jsonl)")
        found.update(dict.fromkeys(files))
    return list(found)


class _GlobWalk:
    """`glob.glob(pattern, recursive=True)`'s paths, walked as glob walks them (a literal part is
    joined, a pattern lists its folder, hidden names only for a pattern starting with '.', `**`
    every folder below, itself included, links to folders followed), with two differences: each
    folder is listed at most once per part of the pattern, so a link back up the tree (a loop)
    ends the walk there instead of never; and a folder it cannot list is kept (`unlisted`, the
    OS's reason), where glob passes over it in silence and leaves out the files it holds.
    A folder reached again by another path holds the same files, and the files are resolved."""

    def __init__(self) -> None:
        self.unlisted: str | None = None
        self._listed: set[tuple[int, int, int]] = set()

    def matches(self, pattern: str) -> list[str]:
        parts = [p for p in pattern.split(os.sep) if p]
        if pattern.endswith(os.sep) or not parts:  # glob names only folders then, or nothing
            return []
        found: list[str] = []
        self._walk(os.sep if os.path.isabs(pattern) else "", parts, 0, found)
        return found

    def _walk(self, folder: str, parts: list[str], index: int, found: list[str]) -> None:
        part, last = parts[index], index == len(parts) - 1
        if not glob.has_magic(part):
            path = os.path.join(folder, part)
            if last and os.path.lexists(path):
                found.append(path)
            elif not last and os.path.isdir(path):
                self._walk(path, parts, index + 1, found)
            return
        entries = self._entries(folder, index)
        if part == "**":
            if not last:
                self._walk(folder, parts, index + 1, found)
            for name, is_folder in entries:
                if name[0] == ".":
                    continue
                if last:
                    found.append(os.path.join(folder, name))
                if is_folder:
                    self._walk(os.path.join(folder, name), parts, index, found)
            return
        hidden = part[0] == "."
        for name, is_folder in entries:
            if (hidden or name[0] != ".") and fnmatch.fnmatchcase(name, part) and (last or is_folder):
                if last:
                    found.append(os.path.join(folder, name))
                else:
                    self._walk(os.path.join(folder, name), parts, index + 1, found)

    def _entries(self, folder: str, index: int) -> list[tuple[str, bool]]:
        """(name, is a folder) of `folder`'s entries; none where it was listed for this part of the
        pattern already, or cannot be listed. A folder sorts as its name and a separator, so the
        walk meets paths in the order of their strings, as glob's sorted list has them: a folder two
        links reach is walked under the path glob would keep (its first, once resolved)."""
        where = folder or os.curdir
        try:
            status = os.stat(where)
            seen = (status.st_dev, status.st_ino, index)
            if seen in self._listed:
                return []
            self._listed.add(seen)
            with os.scandir(where) as listing:
                return sorted(((e.name, _is_folder(e)) for e in listing),
                              key=lambda entry: entry[0] + os.sep if entry[1] else entry[0])
        except OSError as error:
            if self.unlisted is None:
                self.unlisted = (error.strerror or type(error).__name__).lower()
            return []


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def format_of(path: Path, position: int = 1) -> str:
    """"parquet" or "jsonl" (plain, gzip or zstd), from the first bytes; a container the reader
    does not open is SOURCE_INVALID, naming it and what to do."""
    with path.open("rb") as handle:
        head = handle.read(8)
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    unread = next((name for name, magics in UNREAD_MAGIC.items() if head.startswith(magics)), None)
    if unread is not None:
        raise ItoError(ErrorCode.SOURCE_INVALID, f"corpus file #{position} is {unread}-compressed, which is not read: "
                       "decompress it, or compress it with gzip or zstd")
    _refuse_packed(path, position)
    return "jsonl"


def _refuse_packed(path: Path, position: int) -> None:
    """A tar archive, or a Parquet file inside gzip or zstd, is SOURCE_INVALID by what it is:
    read as JSONL lines, it failed after the job ran as "line 1 is not JSON" (or UTF-8)."""
    from ito_assets.data.sources import compression_of

    compression = compression_of(path)
    head = _decompressed_head(path, compression, _TAR_MAGIC_AT + 8)
    packed = f"{compression}-compressed " if compression else ""
    if compression and head.startswith(PARQUET_MAGIC):
        raise ItoError(ErrorCode.SOURCE_INVALID, f"corpus file #{position} is a {packed}Parquet file, which is not read: "
                       "decompress it (Parquet compresses its own pages)")
    if head[_TAR_MAGIC_AT:].startswith(_TAR_MAGICS):
        raise ItoError(ErrorCode.SOURCE_INVALID, f"corpus file #{position} is a {packed}tar archive, which is not read: "
                       "extract it and pass its files (a glob names them all)")


def _decompressed_head(path: Path, compression: str | None, size: int) -> bytes:
    """The first `size` bytes the file's stream holds; fewer where it is shorter or corrupt (the
    reader names a corrupt stream by its line)."""
    import pyarrow as pa

    try:
        with pa.input_stream(str(path), compression=compression) as stream:
            return stream.read(size)
    except OSError:
        return b""


def describe(paths: Sequence[Path]) -> list[CorpusFile]:
    """Each file hashed as stored, its format told from its first bytes."""
    for position, path in enumerate(paths, start=1):
        if re.search(r"\s", str(path)):  # a manifest's uri holds no whitespace
            raise ItoError(ErrorCode.SOURCE_INVALID, f"corpus file #{position} has whitespace in its path; rename it")
        if not _is_utf8(str(path)):  # a manifest is UTF-8 JSON: its uri cannot hold such a name
            raise ItoError(ErrorCode.SOURCE_INVALID, f"corpus file #{position} has a path that is not UTF-8 text; rename it")
    files = [_described(position, path) for position, path in enumerate(paths, start=1)]
    first: dict[str, int] = {}
    for position, file in enumerate(files, start=1):
        if file.sha256 in first:  # a copied file: its documents twice, under the same ids
            raise ItoError(ErrorCode.SOURCE_INVALID, f"corpus files #{first[file.sha256]} and #{position} hold the same bytes; pass one of them")
        first[file.sha256] = position
    return files


def _is_utf8(text: str) -> bool:
    """Whether a path is text: bytes of a name that are not UTF-8 reach Python as lone
    surrogates (surrogateescape), which no UTF-8 document can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _described(position: int, path: Path) -> CorpusFile:
    """One file hashed and its format told; a file this process may not read (its mode, a
    device's fault) is SOURCE_INVALID naming its position and the reason, not the path."""
    try:
        return CorpusFile(path=path, sha256=file_sha256(path), format=format_of(path, position), num_bytes=path.stat().st_size)
    except OSError as error:
        reason = (error.strerror or type(error).__name__).lower()
        raise ItoError(ErrorCode.SOURCE_INVALID, f"corpus file #{position} cannot be read ({reason})") from None


def default_name(files: Sequence[CorpusFile]) -> str:
    """The first file's name up to its first dot, as a manifest name."""
    stem = _NOT_NAME.sub("-", files[0].path.name.split(".", 1)[0]).strip("-._") if files else ""
    return stem[:128] or DEFAULT_NAME


def require_suite_id(suite: EvalSuite) -> None:
    """The suite's id must be able to name it in the manifest's provenance."""
    if not is_suite_id(suite.suite_id):
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, "the eval suite's file name cannot be its id; declare one in "
                       'its first line, {"suite_id": "my-evals-v1"} (letters, digits, . _ -)')


def data_manifest(name: str, files: Sequence[CorpusFile], suite: EvalSuite, license: str, *,
                  text_field: str = "text", id_field: str | None = None) -> bytes:
    """The data manifest's bytes: every file a data reference (its digest, format, licence and
    field names) decontaminated against `suite` with the schema's default n-gram size. Sorted keys
    and a final newline, as the reviewed manifests are written; verified once written
    (`verify.verify_data_manifest`), like any manifest."""
    require_suite_id(suite)
    provenance = {"eval_suite_id": suite.suite_id, "eval_suite_sha256": suite.digest, "method": "ngram",
                  "ngram_size": DecontaminationProvenance.model_fields["ngram_size"].default}
    fields = {"text_field": text_field} | ({"id_field": id_field} if id_field is not None else {})
    document = {
        "schema_version": SCHEMA_VERSION,
        "kind": DATA_KIND,
        "name": name,
        "data": [{"uri": f.uri, "sha256": f.sha256, "license": license, "format": f.format, **fields,
                  "decontamination": provenance} for f in files],
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def store_manifest(folder: Path, data: bytes) -> Path:
    """The manifest at `<folder>/<short digest>.json`, written whole (a temporary file renamed into
    place) and 0600: the secure read refuses a file others may write. The same bytes again are
    the same file."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"{Digest.of_bytes(data).short}.json"
    if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
        return path
    temporary = folder / f".{path.name}.{os.getpid()}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path
