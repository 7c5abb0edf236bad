"""A DCP `FileSystemWriter` that hashes each shard file while writing it, so that no file of a
save is read back to be hashed afterwards.

The seam is the writer's `fs.create_stream`: every `.distcp` file DCP opens for writing gets a
stream that feeds each buffer to a hasher on its way to the file. DCP only appends to these
streams (it asks `tell()` for offsets and never seeks), so the hasher sees the file's bytes in
order; `seekable()` says no, so nothing that might seek is handed one.

Each rank's digests reach rank 0 inside DCP's own gather of write results, as extra
`WriteResult`s that `finish` takes out before `.metadata` is written. No sidecar file can go
missing or stale, and a rank that fails to write fails the save as before. Rank 0 keeps them in
`file_digests` for the completion marker; that needs the save to run in this process (DCP's
thread-based asynchronous save, the default), and a marker without them re-reads the files.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generator

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystem
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ito_assets.runtime.checkpoint.file_digest import FILE_DIGEST, FileDigest, new_hasher

_KEY = "__ito_file_digest__/"  # the fqn prefix of the extra write results; no state dict key starts so


class _HashingStream:
    """The file's stream, with every written buffer hashed on the way."""

    def __init__(self, raw: Any, algorithm: str):
        self._raw = raw
        self._hasher = new_hasher(algorithm)
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._hasher.update(view)
        self.size += view.nbytes
        return self._raw.write(view)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # a seek would write bytes out of the order they were hashed in


class HashingFileSystem(FileSystem):
    def __init__(self, algorithm: str):
        super().__init__()
        self.algorithm = algorithm
        self._lock = threading.Lock()  # DCP may write several files at once (thread_count)
        self._written: list[FileDigest] = []

    @contextmanager
    def create_stream(self, path: str | Path, mode: str) -> Generator[Any, None, None]:
        if mode != "wb" or not str(path).endswith(DEFAULT_SUFFIX):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw, self.algorithm)
            yield stream
        with self._lock:  # only a file written to the end is recorded
            self._written.append(FileDigest(Path(path).name, stream.size, stream.hexdigest()))

    def take(self) -> list[FileDigest]:
        with self._lock:
            taken, self._written = self._written, []
        return taken


def _is_digest(result: WriteResult) -> bool:
    return result.index.fqn.startswith(_KEY)


class DigestingWriter(FileSystemWriter):
    """FileSystemWriter's files and metadata, byte for byte; rank 0 also gets every file's digest."""

    def __init__(self, path: str | Path, *, algorithm: str = FILE_DIGEST, **options: Any):
        super().__init__(path, **options)
        self.algorithm = algorithm
        self.fs = HashingFileSystem(algorithm)
        self.file_digests: tuple[FileDigest, ...] = ()  # every rank's files, on the coordinator after finish

    def reset(self, checkpoint_id: str | Path | None = None) -> None:
        super().reset(checkpoint_id)
        self.fs.take()  # nothing from an earlier, failed save
        self.file_digests = ()

    def write_data(self, plan, planner) -> Future[list[WriteResult]]:
        results = super().write_data(plan, planner).wait()  # FileSystemWriter has written when it returns
        digests = [WriteResult(index=MetadataIndex(_KEY + d.name), size_in_bytes=d.size, storage_data=d)
                   for d in self.fs.take()]
        future: Future[list[WriteResult]] = Future()
        future.set_result(results + digests)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        found = [r.storage_data for rank in results for r in rank if _is_digest(r)]
        self.file_digests = tuple(sorted(found, key=lambda d: d.name))
        super().finish(metadata, [[r for r in rank if not _is_digest(r)] for rank in results])
