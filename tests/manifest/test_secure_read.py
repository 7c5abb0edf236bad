"""ito_assets.manifest.secure_read: a manifest is read once, from a regular file, never via a link."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest import secure_read
from ito_assets.manifest.secure_read import DEFAULT_MAX_BYTES, ManifestBytes, read_manifest_bytes

CANARY = "CANARY-SECRET-1234"
REAL = b'{"manifest": "real", "note": "' + CANARY.encode() + b'"}\n'
DECOY = b'{"manifest": "decoy"}\n'

# None: auto-detect (openat2 where the kernel allows it); False: the O_PATH component walk.
BOTH_PATHS = pytest.mark.parametrize("use_openat2", [None, False], ids=["auto", "walk"])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # realpath: the reader refuses symlinked parents, so the fixture must not hand it one.
    return Path(os.path.realpath(tmp_path))


def write(path: Path, data: bytes = REAL, mode: int = 0o644) -> str:
    path.write_bytes(data)
    os.chmod(path, mode)  # the umask varies between machines; pin the mode under test
    return str(path)


def expect(code: ErrorCode, path, root: Path | None = None, **kwargs) -> ItoError:
    with pytest.raises(ItoError) as info:
        read_manifest_bytes(path, **kwargs)
    err = info.value
    assert err.code == code, err.message
    for text in (err.message, str(err), repr(err.to_dict())):
        assert CANARY not in text
        if isinstance(path, str) and len(path) > 1:
            assert path not in text
        if root is not None:
            assert str(root) not in text
    return err


# --- the happy path ---------------------------------------------------------------------------


@BOTH_PATHS
def test_reads_exact_bytes_and_digest(root: Path, use_openat2) -> None:
    path = write(root / "manifest.json")
    got = read_manifest_bytes(path, use_openat2=use_openat2)
    assert isinstance(got, ManifestBytes)
    assert got.data == REAL
    assert got.sha256_hex == hashlib.sha256(REAL).hexdigest()
    assert got.digest == "sha256:" + hashlib.sha256(REAL).hexdigest()
    assert got.size == len(REAL)


def test_default_limit_is_256_kib() -> None:
    assert DEFAULT_MAX_BYTES == 256 * 1024


def test_empty_file_is_read(root: Path) -> None:
    got = read_manifest_bytes(write(root / "empty.json", b""))
    assert got.data == b"" and got.sha256_hex == hashlib.sha256(b"").hexdigest()



@pytest.mark.parametrize("errno_", [38, 1, 22], ids=["ENOSYS", "EPERM-seccomp", "EINVAL"])
def test_probe_falls_back_to_walk_when_openat2_is_refused(root: Path, monkeypatch, errno_: int) -> None:
    def refused(path: bytes, flags: int) -> int:
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(secure_read, "_openat2", refused)
    secure_read._openat2_available.cache_clear()
    try:
        assert secure_read._openat2_available() is False
        assert read_manifest_bytes(write(root / "m.json")).data == REAL
        (root / "link.json").symlink_to(root / "m.json")
        expect(ErrorCode.MANIFEST_SYMLINK, str(root / "link.json"), root)
    finally:
        secure_read._openat2_available.cache_clear()

# --- path shape -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "suffix",
    ["/../{d}/m.json", "/./m.json", "//m.json", "/m.json/", "/m.json/.", "/m.json\0"],
    ids=["dotdot", "dot", "double-slash", "trailing-slash", "trailing-dot", "nul"],
)
def test_non_canonical_paths_are_refused(root: Path, suffix: str) -> None:
    write(root / "m.json")
    expect(ErrorCode.MANIFEST_PATH_NOT_CANONICAL, str(root) + suffix.format(d=root.name), root)


@pytest.mark.parametrize("bad", ["m.json", "./m.json", "", "/", b"/etc/hostname", None, 3])
def test_relative_empty_or_non_str_paths_are_refused(bad) -> None:
    expect(ErrorCode.MANIFEST_PATH_NOT_CANONICAL, bad)


@BOTH_PATHS
def test_missing_file(root: Path, use_openat2) -> None:
    expect(ErrorCode.MANIFEST_NOT_FOUND, str(root / "absent.json"), root, use_openat2=use_openat2)
    expect(ErrorCode.MANIFEST_NOT_FOUND, str(root / "no" / "m.json"), root, use_openat2=use_openat2)


# --- links --------------------------------------------------------------------------------------


@BOTH_PATHS
def test_symlink_as_last_component(root: Path, use_openat2) -> None:
    target = write(root / "real.json")
    (root / "link.json").symlink_to(target)
    expect(ErrorCode.MANIFEST_SYMLINK, str(root / "link.json"), root, use_openat2=use_openat2)


@BOTH_PATHS
def test_symlink_as_intermediate_directory(root: Path, use_openat2) -> None:
    (root / "real").mkdir()
    write(root / "real" / "m.json")
    (root / "via").symlink_to(root / "real")
    expect(ErrorCode.MANIFEST_SYMLINK, str(root / "via" / "m.json"), root, use_openat2=use_openat2)


@BOTH_PATHS
def test_dangling_symlink(root: Path, use_openat2) -> None:
    (root / "link.json").symlink_to(root / "nowhere.json")
    expect(ErrorCode.MANIFEST_SYMLINK, str(root / "link.json"), root, use_openat2=use_openat2)


@BOTH_PATHS
def test_file_used_as_directory(root: Path, use_openat2) -> None:
    write(root / "m.json")
    expect(ErrorCode.MANIFEST_NOT_REGULAR, str(root / "m.json" / "x"), root, use_openat2=use_openat2)


@BOTH_PATHS
def test_second_hard_link(root: Path, use_openat2) -> None:
    path = write(root / "m.json")
    os.link(path, root / "other.json")
    expect(ErrorCode.MANIFEST_HARD_LINKED, path, root, use_openat2=use_openat2)


@BOTH_PATHS
@pytest.mark.timeout(30)
def test_racing_directory_swap_never_yields_decoy(root: Path, use_openat2) -> None:
    """A thread swaps an intermediate directory for a symlink to a decoy as fast as it can."""
    (root / "d").mkdir()
    (root / "decoy").mkdir()
    path = write(root / "d" / "m.json", REAL)
    write(root / "decoy" / "m.json", DECOY)  # passes every other check: only link-following returns it
    (root / "link").symlink_to(root / "decoy")
    with open(root / "link" / "m.json", "rb") as fh:  # the setup is meaningful: following finds the decoy
        assert fh.read() == DECOY

    stop = threading.Event()

    def swap() -> None:
        d, aside, link = root / "d", root / "d.aside", root / "link"
        while not stop.is_set():
            os.rename(d, aside)
            os.rename(link, d)  # now .../d is a symlink to the decoy directory
            os.rename(d, link)
            os.rename(aside, d)

    racer = threading.Thread(target=swap, daemon=True)
    results: dict[str, int] = {}
    racer.start()
    try:
        deadline, calls = time.monotonic() + 1.0, 0
        while time.monotonic() < deadline or calls < 300:
            calls += 1
            try:
                got = read_manifest_bytes(path, use_openat2=use_openat2)
            except ItoError as err:
                assert CANARY not in err.message and str(root) not in err.message
                results[err.code.value] = results.get(err.code.value, 0) + 1
                continue
            assert got.data == REAL, "the decoy was returned through a swapped-in symlink"
            assert got.sha256_hex == hashlib.sha256(got.data).hexdigest(), "the digest is not of the bytes read"
            results["ok"] = results.get("ok", 0) + 1
    finally:
        stop.set()
        racer.join(timeout=10)
    assert not racer.is_alive()
    assert calls >= 300
    assert set(results) <= {"ok", "MANIFEST_SYMLINK", "MANIFEST_NOT_FOUND", "MANIFEST_CHANGED"}, results
    assert read_manifest_bytes(path, use_openat2=use_openat2).data == REAL  # state restored


# --- not a regular file -------------------------------------------------------------------------


@BOTH_PATHS
@pytest.mark.timeout(10)
def test_fifo_is_refused_without_blocking(root: Path, use_openat2) -> None:
    fifo = root / "m.json"
    os.mkfifo(fifo, 0o644)
    started = time.monotonic()
    expect(ErrorCode.MANIFEST_NOT_REGULAR, str(fifo), root, use_openat2=use_openat2)
    assert time.monotonic() - started < 5


@BOTH_PATHS
def test_char_device_is_refused(use_openat2) -> None:
    expect(ErrorCode.MANIFEST_NOT_REGULAR, "/dev/null", use_openat2=use_openat2)


@BOTH_PATHS
def test_directory_is_refused(root: Path, use_openat2) -> None:
    (root / "dir.json").mkdir(mode=0o755)
    expect(ErrorCode.MANIFEST_NOT_REGULAR, str(root / "dir.json"), root, use_openat2=use_openat2)


@BOTH_PATHS
def test_proc_self_is_a_symlink(use_openat2) -> None:
    # /proc/self is a symlink, so the no-symlink open refuses it before anything is read.
    if not os.path.islink("/proc/self"):
        pytest.skip("no procfs here")
    err = expect(ErrorCode.MANIFEST_SYMLINK, "/proc/self/status", use_openat2=use_openat2)
    assert "Pid" not in err.message


@BOTH_PATHS
def test_procfs_file_is_refused(use_openat2) -> None:
    # Canonical, S_ISREG and root-owned, but its content is synthesized: refused by fstatfs.
    if not os.path.isfile("/proc/1/status"):
        pytest.skip("no procfs here")
    expect(ErrorCode.MANIFEST_NOT_REGULAR, "/proc/1/status", use_openat2=use_openat2)


@BOTH_PATHS
def test_sysfs_file_is_refused(use_openat2) -> None:
    if not os.path.isfile("/sys/kernel/uevent_seqnum"):
        pytest.skip("no sysfs here")
    expect(ErrorCode.MANIFEST_NOT_REGULAR, "/sys/kernel/uevent_seqnum", use_openat2=use_openat2)


# --- ownership, permissions and size ------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o620])
def test_group_or_world_writable_is_refused(root: Path, mode: int) -> None:
    expect(ErrorCode.MANIFEST_UNSAFE_PERMISSIONS, write(root / "m.json", mode=mode), root)


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o644, 0o444])
def test_restrictive_modes_are_accepted(root: Path, mode: int) -> None:
    if mode & 0o400 == 0 and os.geteuid() != 0:
        pytest.skip("unreadable without root")
    assert read_manifest_bytes(write(root / "m.json", mode=mode)).data == REAL


def test_foreign_owner_is_refused(root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root; the CI runs these tests as root")
    path = write(root / "m.json")
    os.chown(path, 65534, 65534)
    expect(ErrorCode.MANIFEST_UNSAFE_OWNER, path, root)


def test_unreadable_file(root: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    expect(ErrorCode.MANIFEST_UNSAFE_PERMISSIONS, write(root / "m.json", mode=0o200), root)


def test_size_exactly_at_limit_is_accepted(root: Path) -> None:
    data = b"x" * 64
    assert read_manifest_bytes(write(root / "m.json", data), max_bytes=64).data == data


def test_size_over_limit_is_refused(root: Path) -> None:
    data = (CANARY.encode() * 8)[:65]
    expect(ErrorCode.MANIFEST_TOO_LARGE, write(root / "m.json", data), root, max_bytes=64)


# --- the file changes while it is read ----------------------------------------------------------


def _grow_after_first_read(monkeypatch, path: str, extra: bytes) -> None:
    real_read, calls = os.read, []

    def read(fd: int, n: int) -> bytes:
        chunk = real_read(fd, n)
        calls.append(n)
        if len(calls) == 1:
            with open(path, "ab") as fh:  # a writer appends between our reads
                fh.write(extra)
        return chunk

    monkeypatch.setattr(secure_read.os, "read", read)


@BOTH_PATHS
def test_growth_during_read_is_detected(root: Path, monkeypatch, use_openat2) -> None:
    path = write(root / "m.json")
    _grow_after_first_read(monkeypatch, path, b' {"injected": true}')
    expect(ErrorCode.MANIFEST_CHANGED, path, root, use_openat2=use_openat2)


def test_growth_past_the_limit_stops_reading(root: Path, monkeypatch) -> None:
    path = write(root / "m.json", b"{}")
    _grow_after_first_read(monkeypatch, path, CANARY.encode() * 100)
    expect(ErrorCode.MANIFEST_TOO_LARGE, path, root, max_bytes=64)


def test_read_error_is_reported_safely(root: Path, monkeypatch) -> None:
    path = write(root / "m.json")

    def read(fd: int, n: int) -> bytes:
        raise OSError(5, "Input/output error", path)

    monkeypatch.setattr(secure_read.os, "read", read)
    expect(ErrorCode.MANIFEST_CHANGED, path, root)


# --- messages never leak ------------------------------------------------------------------------


def test_messages_never_contain_canary_or_path(root: Path) -> None:
    """Every failure on a file (and a path) holding the canary keeps it out of the message."""
    canary_dir = root / CANARY
    canary_dir.mkdir()
    (canary_dir / "real").mkdir()
    cases = []
    cases.append((write(canary_dir / "big.json", CANARY.encode() * 10), {"max_bytes": 16}))
    cases.append((write(canary_dir / "gw.json", mode=0o666), {}))
    hard = write(canary_dir / "hard.json")
    os.link(hard, canary_dir / "hard2.json")
    cases.append((hard, {}))
    (canary_dir / "link.json").symlink_to(hard)
    cases.append((str(canary_dir / "link.json"), {}))
    (canary_dir / "via").symlink_to(canary_dir / "real")
    cases.append((str(canary_dir / "via" / "x.json"), {"use_openat2": False}))
    cases.append((str(canary_dir / "missing.json"), {}))
    cases.append((str(canary_dir) + "/../x.json", {}))
    for path, kwargs in cases:
        with pytest.raises(ItoError) as info:
            read_manifest_bytes(path, **kwargs)
        err = info.value
        for text in (err.message, str(err), repr(err.to_dict())):
            assert CANARY not in text and str(root) not in text
