"""Files of the runtime: folders kept inside the run's checkpoint folder, atomic writes, appends.

The server resolves the policy's `storage_uri` inside the tenant's area before a run exists
(`ito_assets.control.validation.resolve_checkpoint_dir`); here every folder the runtime creates is
named from safe parts only (no `..`, no empty or hidden component) and checked again after it was
created, so that a link planted inside the area cannot lead out of it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from ito_assets.errors import ErrorCode, ItoError

_SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _parts(relative: str) -> list[str]:
    parts = relative.split("/")
    if not parts or any(not _SAFE_PART.fullmatch(p) for p in parts):
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "a checkpoint folder name is malformed")
    return parts


def _inside(path: Path, area: Path) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(area)]) == os.path.realpath(area)


def child(folder: Path, name: str) -> Path:
    """`folder/name` for a name made of safe parts (a run id, a stage name)."""
    return folder.joinpath(*_parts(name))


def ensure_dir(path: Path, area: Path) -> Path:
    """Create `path` (0700) and prove it still lies inside `area` (the run's checkpoint folder)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "checkpoint storage is not writable") from None
    if path.is_symlink() or not _inside(path, area):
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "checkpoint storage must lie inside the tenant's area")
    return path


def write_atomic(path: Path, data: bytes | Callable[[BinaryIO], object], *, durable: bool = True) -> None:
    """Write to a temporary sibling and rename: readers see all or nothing. `data` is the bytes, or
    a function that writes them to the open file (an array saved straight to it, never copied to
    bytes first). `durable` adds the fsyncs that make it survive a machine crash (markers, verdicts),
    not just a process kill."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as handle:
            data(handle) if callable(data) else handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:  # a full disk mid-write: its part would hold space the retry needs
        with contextlib.suppress(OSError):  # the first error is the one to report
            temporary.unlink(missing_ok=True)
        raise
    if not durable:
        return
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_regular_file(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of `path` when it is a regular file of at most `max_bytes`, else None: a link (it
    could speak for a file elsewhere), a FIFO or device (an open or a read would block the reader
    for ever), a folder, a file too large to be what the reader expects, or one gone meanwhile. For
    the small files other processes leave beside a run (markers, heartbeats, proposals)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(descriptor, left)):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    return data if len(data) <= max_bytes else None  # grown past the bound while read


# What flock raises where the file system does not implement it (Lustre without -o flock, NFS
# mounted nolock).
NO_LOCKS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL})


@contextlib.contextmanager
def held_alone(path: Path, busy: Callable[[], Exception]) -> Iterator[None]:
    """An exclusive lock on the file `path` (made if missing, never through a link) while the
    block runs, or `busy()` raised at once where another process, or another open of it, holds
    it. flock: the kernel releases it when the holder dies, so a killed holder leaves no stale
    lock. On a file system without locks the block runs unguarded, as it did before locks."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy() from None
        except OSError as error:
            if error.errno not in NO_LOCKS:
                raise
        yield
    finally:
        os.close(descriptor)  # releases the lock


def append_line(path: Path, line: str, *, durable: bool = True) -> None:
    """Append one line with O_APPEND (one write: lines do not interleave between processes). A file
    that ends inside a line (its writer killed, or its disk full, mid-append) gets a newline first:
    the torn line stays alone and is skipped, and this one is read whole rather than joined to it."""
    data = (line.rstrip("\n") + "\n").encode()
    descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if _ends_inside_a_line(descriptor):
            data = b"\n" + data
        _write_all(descriptor, data)
        if durable:
            os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _ends_inside_a_line(descriptor: int) -> bool:
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_size == 0:  # a pipe has no last byte to read
        return False
    return os.pread(descriptor, 1, info.st_size - 1) != b"\n"


def _write_all(descriptor: int, data: bytes) -> None:
    """A disk that fills mid-write takes part of the line and returns short; writing the rest
    raises the OS's own error (ENOSPC, EFBIG), which callers classify, instead of returning as if whole."""
    view = memoryview(data)
    while view:
        written = os.write(descriptor, view)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def json_lines(path: Path) -> Iterator[dict]:
    """Every line of a JSON-lines file that holds one JSON object, in order. A line that does not
    (cut short by a killed writer, not UTF-8, NUL bytes, nested past the decoder's depth) is skipped
    alone: the lines after it are read as ever."""
    for raw in path.read_bytes().split(b"\n"):
        try:
            value = json.loads(raw.decode())
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            continue
        if isinstance(value, dict):
            yield value


@dataclass(frozen=True, kw_only=True)
class RunLayout:
    checkpoint_dir: Path  # the run's folder as the server approved it
    run_dir: Path

    @classmethod
    def for_run(cls, checkpoint_dir: Path, run_id: str) -> "RunLayout":
        """The server approves one folder per run, already named after it (`<root>/<run_id>`), so
        the stages live directly in it and a path names the run once. A run started before that
        rule kept them one level down, in a second folder named after the run: it is found there."""
        earlier = child(checkpoint_dir, run_id)
        return cls(checkpoint_dir=checkpoint_dir, run_dir=earlier if earlier.is_dir() else checkpoint_dir)

    def holds(self, path: str | Path) -> bool:
        """Whether `path` lies in this run's folder, links resolved. A stage's hand-over to the next
        must: Dagster keeps one output per asset and manifest partition, and another ledger run of
        the same manifest may have written it since."""
        return Path(path).resolve().is_relative_to(self.run_dir.resolve())

    def stage_dir(self, stage: str) -> Path:
        """One folder per run and stage: restarts of a stage share it, runs never do."""
        return ensure_dir(child(self.run_dir, stage), self.checkpoint_dir)

    @property
    def posttraining_dir(self) -> Path:
        """Where the post-training stages keep a folder each (`<run>/posttraining/<stage>/`)."""
        return self.run_dir / _POSTTRAINING_FOLDER

    def stage_dirs(self) -> dict[str, Path]:
        """stage -> its folder, for every stage that has one, in the run's order: the stages that
        started (a stage the manifest leaves out never makes one)."""
        # Here, not at the top: the supervisor imports this module and would pay pydantic's 0.3 s.
        from ito_assets.manifest.schema import POST_TRAINING_ORDER, STAGE_ORDER

        folders = {**{stage: self.run_dir / stage for stage in STAGE_ORDER},
                   **{stage: self.posttraining_dir / stage for stage in POST_TRAINING_ORDER}}
        return {stage: folder for stage, folder in folders.items() if folder.is_dir() and not folder.is_symlink()}


_POSTTRAINING_FOLDER = "posttraining"
