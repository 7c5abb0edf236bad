"""Read a reviewed manifest from disk without following links and hash exactly what was read.

So that what is hashed is the very file a reviewer named, the client canonicalizes the path,
rejects symlinks, opens a regular file without following links, requires proper ownership and
restrictive permissions, bounds the size and hashes the bytes read from the open descriptor.
Anything unexpected fails closed with an ItoError whose message never echoes the path or the
file's content (either may hold secrets).

Linux only: openat2(2) with RESOLVE_NO_SYMLINKS where the kernel and seccomp allow it, else an
O_PATH component walk from "/" that refuses a symlink at every step.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import platform
import stat
from dataclasses import dataclass

from ito_assets.digests import Digest
from ito_assets.errors import ErrorCode, ItoError

# Manifests are small, reviewed JSON documents: a tight bound keeps memory and time per read
# predictable and turns a path pointed at something huge into a clear error instead of a stall.
DEFAULT_MAX_BYTES = 256 * 1024

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}  # syscall numbers where we have verified them
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
# O_NONBLOCK: opening a FIFO must never hang; O_NOCTTY: a tty must never become our terminal.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_CHUNK = 64 * 1024

# Kernel pseudo filesystems report S_ISREG files whose size and content are synthesized on read.
_PSEUDO_FS_MAGIC = frozenset({
    0x9FA0,      # procfs
    0x62656572,  # sysfs
    0x64626720,  # debugfs
    0x74726163,  # tracefs
    0x73636673,  # securityfs
    0x0027E0EB,  # cgroup
    0x63677270,  # cgroup2
    0x1CD1,      # devpts
    0xCAFE4A11,  # bpffs
    0x6165676C,  # pstore
    0xDE5E81E4,  # efivarfs
    0x62656570,  # configfs
    0x65735543,  # fusectl
    0x42494E4D,  # binfmt_misc
    0xF97CFF8C,  # selinuxfs
    0x6E736673,  # nsfs
})


@dataclass(frozen=True)
class ManifestBytes:
    data: bytes
    sha256_hex: str  # 64 lowercase hex digits over exactly `data`

    @property
    def digest(self) -> Digest:
        return Digest.of_hex(self.sha256_hex)

    @property
    def size(self) -> int:
        return len(self.data)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    return lib


def _openat2(path: bytes, flags: int) -> int:
    """Raw openat2 relative to the cwd (ignored for absolute paths); raises OSError like os.open."""
    how = _OpenHow(flags, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _libc().syscall(
        ctypes.c_long(_SYS_OPENAT2[platform.machine()]), ctypes.c_int(_AT_FDCWD),
        ctypes.c_char_p(path), ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))  # deliberately without the filename
    return fd


@functools.lru_cache(maxsize=1)
def _openat2_available() -> bool:
    # Old kernels answer ENOSYS, seccomp profiles ENOSYS or EPERM, unknown fields EINVAL:
    # any failure on a trivial open of "/" means "use the component walk".
    if platform.machine() not in _SYS_OPENAT2:
        return False
    try:
        os.close(_openat2(b"/", os.O_PATH | os.O_CLOEXEC))
    except (OSError, AttributeError):
        return False
    return True


def _check_canonical(path: object) -> list[str]:
    """Textual check: the caller must name the file exactly, so a reviewer sees the real path."""
    ok = isinstance(path, str) and path.startswith("/") and "\0" not in path
    parts = path.split("/")[1:] if ok else []
    if not ok or any(p in ("", ".", "..") for p in parts):
        raise ItoError(
            ErrorCode.MANIFEST_PATH_NOT_CANONICAL, "the manifest path must be absolute and canonical"
        )
    return parts


def _open_error(exc: OSError) -> ItoError:
    if exc.errno == errno.ELOOP:
        return ItoError(ErrorCode.MANIFEST_SYMLINK, "the manifest path must not contain a symbolic link")
    if exc.errno == errno.ENOENT:
        return ItoError(ErrorCode.MANIFEST_NOT_FOUND, "the manifest file does not exist")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ItoError(ErrorCode.MANIFEST_UNSAFE_PERMISSIONS, "the manifest cannot be opened for reading")
    if exc.errno in (errno.ENOTDIR, errno.ENXIO, errno.ENODEV, errno.EISDIR):
        return ItoError(ErrorCode.MANIFEST_NOT_REGULAR, "the manifest must be a regular file")
    return ItoError(ErrorCode.MANIFEST_NOT_FOUND, "the manifest cannot be opened")


def _walk_component(dirfd: int, comp: str) -> int:
    """Open one directory component with O_PATH, telling a symlink from a non-directory."""
    try:
        return os.open(comp, _DIR_FLAGS, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise _open_error(exc) from None
    try:
        mode = os.stat(comp, dir_fd=dirfd, follow_symlinks=False).st_mode
    except OSError as exc:
        raise _open_error(exc) from None
    if stat.S_ISLNK(mode):
        raise ItoError(ErrorCode.MANIFEST_SYMLINK, "the manifest path must not contain a symbolic link")
    if stat.S_ISDIR(mode):  # it was a symlink or file a moment ago: someone is swapping it
        raise ItoError(ErrorCode.MANIFEST_CHANGED, "the manifest path changed while it was opened")
    raise ItoError(ErrorCode.MANIFEST_NOT_REGULAR, "a directory in the manifest path is not a directory")


def _open_by_walk(parts: list[str]) -> int:
    dirfd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for comp in parts[:-1]:
            nextfd = _walk_component(dirfd, comp)
            os.close(dirfd)
            dirfd = nextfd
        try:
            return os.open(parts[-1], _OPEN_FLAGS, dir_fd=dirfd)
        except OSError as exc:
            raise _open_error(exc) from None
    finally:
        os.close(dirfd)


def _open_no_follow(path: str, parts: list[str], use_openat2: bool | None) -> int:
    if use_openat2 is None:
        use_openat2 = _openat2_available()
    if not use_openat2:
        return _open_by_walk(parts)
    try:
        return _openat2(os.fsencode(path), _OPEN_FLAGS)
    except OSError as exc:
        raise _open_error(exc) from None


def _fs_magic(fd: int) -> int:
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes; f_type is its first long
    if _libc().fstatfs(ctypes.c_int(fd), buf) != 0:
        raise ItoError(ErrorCode.MANIFEST_NOT_REGULAR, "the manifest's filesystem cannot be checked")
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _check_opened(fd: int, path: str, max_bytes: int) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or _fs_magic(fd) in _PSEUDO_FS_MAGIC:
        raise ItoError(ErrorCode.MANIFEST_NOT_REGULAR, "the manifest must be a regular file")
    try:  # defence in depth: the descriptor must still be the file the caller named
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        where = path  # no /proc here: the no-symlink open above is the guarantee
    if where != path:
        raise ItoError(ErrorCode.MANIFEST_CHANGED, "the manifest path changed while it was opened")
    if st.st_uid not in (os.geteuid(), 0):
        raise ItoError(ErrorCode.MANIFEST_UNSAFE_OWNER, "the manifest must be owned by the caller or root")
    if st.st_mode & 0o022:
        raise ItoError(
            ErrorCode.MANIFEST_UNSAFE_PERMISSIONS, "the manifest must not be group- or world-writable"
        )
    if st.st_nlink != 1:
        raise ItoError(ErrorCode.MANIFEST_HARD_LINKED, "the manifest must have exactly one hard link")
    if st.st_size > max_bytes:
        raise ItoError(ErrorCode.MANIFEST_TOO_LARGE, "the manifest exceeds the size limit")
    return st


def _read_bounded(fd: int, max_bytes: int) -> bytes:
    # Read one byte past the limit so growth after fstat is detected without reading unbounded data.
    chunks, total = [], 0
    try:
        while total <= max_bytes:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError:
        raise ItoError(ErrorCode.MANIFEST_CHANGED, "the manifest could not be read consistently") from None
    if total > max_bytes:
        raise ItoError(ErrorCode.MANIFEST_TOO_LARGE, "the manifest exceeds the size limit")
    return b"".join(chunks)


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_manifest_bytes(
    path: str, *, max_bytes: int = DEFAULT_MAX_BYTES, use_openat2: bool | None = None
) -> ManifestBytes:
    """Open `path` without following any link, check it, and return its bytes and sha256.

    use_openat2: None auto-detects; False forces the component walk; True forces openat2.
    The path is opened exactly once; every check and the digest use that one descriptor.
    """
    parts = _check_canonical(path)
    fd = _open_no_follow(path, parts, use_openat2)
    try:
        before = _check_opened(fd, path, max_bytes)
        data = _read_bounded(fd, max_bytes)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if _identity(before) != _identity(after) or len(data) != before.st_size:
        raise ItoError(ErrorCode.MANIFEST_CHANGED, "the manifest changed while it was read")
    return ManifestBytes(data=data, sha256_hex=hashlib.sha256(data).hexdigest())
