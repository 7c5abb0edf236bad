"""The SQLite ledger's folder is 0700 whoever made it first: the ledger itself, or a caller that made
it a moment before with the default mode. A folder that holds other things keeps its owner's mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ito_assets.api import server
from ito_assets.control.ledger import open_ledger


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _open(folder: Path) -> None:
    open_ledger(f"sqlite:///{folder / 'ledger.db'}").dispose()


def _folder(path: Path, *entries: str) -> Path:
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)  # whatever the umask: as `mkdir -p` leaves it under the usual 022
    for name in entries:
        if "." in name:
            (path / name).write_text("")
        else:
            (path / name).mkdir()
    return path


def test_a_folder_the_ledger_makes_is_0700(tmp_path):
    _open(tmp_path / "new" / "state")
    assert _mode(tmp_path / "new" / "state") == 0o700 and _mode(tmp_path / "new" / "state" / "ledger.db") == 0o600


@pytest.mark.parametrize("entries", [(), ("ledger.db",), ("ledger.db", "ledger.db-wal", "ledger.db-shm"),
                                     ("dagster", "tenants", "walkthrough", "warehouse.duckdb", "warehouse.lineage"),
                                     ("shards", "decision", "data-manifests", "warehouse.duckdb.wal")],
                         ids=["empty", "an older ledger", "with its journal", "the state folder", "after a data run"])
def test_a_folder_of_the_ledger_or_of_the_state_alone_is_tightened(tmp_path, entries):
    folder = _folder(tmp_path / "state", *entries)
    _open(folder)
    assert _mode(folder) == 0o700


@pytest.mark.parametrize("stranger", ["notes.txt", "projects", ".bashrc", "ledger.txt"])
def test_a_folder_that_holds_anything_else_keeps_its_mode(tmp_path, stranger):
    # A home or shared folder the URL points into: its owner chose its mode for what else is there.
    folder = _folder(tmp_path / "home", "dagster", stranger)
    _open(folder)
    assert _mode(folder) == 0o755 and _mode(folder / "ledger.db") == 0o600


@pytest.mark.parametrize("mode", [0o1777, 0o2770])
def test_a_sticky_or_setgid_folder_keeps_its_mode(tmp_path, mode):
    # /tmp and its kind, or a group's setgid folder, are shared by design, even when empty and
    # owned by this user (root's /tmp).
    folder = _folder(tmp_path / "shared")
    os.chmod(folder, mode)
    _open(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root")
def test_a_folder_of_another_user_keeps_its_mode(tmp_path):
    folder = _folder(tmp_path / "theirs")
    os.chown(folder, 65534, 65534)
    _open(folder)
    assert _mode(folder) == 0o755


def test_serve_s_ledger_folder_is_0700(tmp_path):
    old = os.umask(0o022)
    try:
        config = server.load_config("127.0.0.1", 0, {"ITO_STATE_DIR": str(tmp_path / "state")})
        server.open_api(config).ledger.dispose()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "state") == 0o700 and _mode(tmp_path / "state" / "ledger.db") == 0o600
