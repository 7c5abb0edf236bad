"""Cleanup over hostile files in the tenant's area: a link out of it among several runs, a tree
deeper than Python's recursion limit and PATH_MAX, a file where a run's folder should be, odd
names and special files, a folder the server may not write, an active run's folder inside a
finished run's, and two cleanups at once. Each run's report says exactly what was removed, what
was kept and why; a canary outside the area always survives."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from gate_world import at_once, manifest_bytes, new_run
from test_lifecycle_boundaries import (cleanup_ref, clean, code_of, events, finish, key_record, run_row,
                                       untouched, write_file)
from ito_assets.errors import ErrorCode
from ito_assets.control import runs
from ito_assets.control.states import RunState

CANARY = b"canary: must survive every cleanup"


def _canary(tmp_path) -> str:
    folder = tmp_path / "outside-the-area"
    folder.mkdir(exist_ok=True)
    (folder / "canary.txt").write_bytes(CANARY)
    return str(folder)


def _canary_intact(folder: str) -> bool:
    with open(os.path.join(folder, "canary.txt"), "rb") as handle:
        return handle.read() == CANARY


def _finished(world, **files: int) -> runs.Run:
    run = new_run(world)
    for name, size in files.items():
        write_file(os.path.join(run.checkpoint_dir, name), size)
    finish(world, run)
    return run


def _deep(folder: str, depth: int) -> None:
    """`depth` nested folders named dddd, a 3-byte file at the bottom; made by descriptor, since
    the path grows past PATH_MAX."""
    os.makedirs(folder)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("dddd", dir_fd=fd)
            child = os.open("dddd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("leaf.pt", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd)
        os.write(leaf, b"abc")
        os.close(leaf)
    finally:
        os.close(fd)


def test_a_link_out_of_the_area_refuses_the_whole_cleanup_before_any_run_is_removed(world, tmp_path) -> None:
    outside = _canary(tmp_path)
    # The run listed first (by run id) is a plain one the cleanup could remove; the second's folder
    # is a link out of the area.
    first, second = sorted([new_run(world), new_run(world, booking_id=world.booking())], key=lambda r: r.run_id)
    write_file(os.path.join(first.checkpoint_dir, "step-1.pt"), 4)
    os.makedirs(os.path.dirname(second.checkpoint_dir), exist_ok=True)
    os.symlink(outside, second.checkpoint_dir)
    finish(world, first)
    finish(world, second)
    ref = cleanup_ref(world)
    assert code_of(lambda: clean(world, ref, "clean-key-0001")) is ErrorCode.CHECKPOINT_STORAGE_INVALID
    # Nothing removed, not even the first run's own files, and nothing recorded.
    assert os.path.getsize(os.path.join(first.checkpoint_dir, "step-1.pt")) == 4
    assert _canary_intact(outside) and os.path.islink(second.checkpoint_dir)
    assert untouched(world, ref) and key_record(world, "clean-key-0001") is None
    assert events(world, "tenant_cleaned") == []


def test_a_tree_deeper_than_the_recursion_limit_and_path_max_is_removed_and_counted(world) -> None:
    run = new_run(world)
    _deep(run.checkpoint_dir, 1_050)  # past sys.getrecursionlimit() (1,000) and PATH_MAX (4,096 bytes)
    finish(world, run)
    try:
        report = clean(world, cleanup_ref(world), "clean-key-0001")
    finally:
        if os.path.lexists(run.checkpoint_dir):  # pytest's own rmtree recurses and would fail on it
            subprocess.run(["rm", "-rf", run.checkpoint_dir], check=False)
    assert report["runs"] == [{"run_id": run.run_id, "num_files_removed": 1, "num_bytes_removed": 3,
                               "num_checkpoints_removed": 0}]
    assert report["runs_kept"] == [] and not os.path.lexists(run.checkpoint_dir)


def test_a_file_where_the_runs_folder_should_be_is_removed_and_counted(world) -> None:
    run = new_run(world)
    write_file(run.checkpoint_dir, 11)
    finish(world, run)
    report = clean(world, cleanup_ref(world), "clean-key-0001")
    assert report["runs"] == [{"run_id": run.run_id, "num_files_removed": 1, "num_bytes_removed": 11,
                               "num_checkpoints_removed": 0}]
    assert not os.path.lexists(run.checkpoint_dir)


def test_odd_names_and_special_files_are_removed_as_entries(world, tmp_path) -> None:
    outside = _canary(tmp_path)
    run = _finished(world, **{"line\nbreak.pt": 5})
    folder = os.fsencode(run.checkpoint_dir)
    with open(folder + b"/not-utf8-\xff\xfe.pt", "wb") as handle:
        handle.write(b"1234567")
    os.mkfifo(os.path.join(run.checkpoint_dir, "a-fifo"))
    short = os.path.join(run.checkpoint_dir, "s")  # a socket's path has a 108-byte limit
    listener = socket.socket(socket.AF_UNIX)
    try:
        cwd = os.getcwd()
        os.chdir(run.checkpoint_dir)
        try:
            listener.bind("s")
        finally:
            os.chdir(cwd)
        os.symlink(outside, os.path.join(run.checkpoint_dir, "to-outside"))
        os.symlink(os.path.join(outside, "canary.txt"), os.path.join(run.checkpoint_dir, "to-canary"))
        report = clean(world, cleanup_ref(world), "clean-key-0001")
    finally:
        listener.close()
    (cleaned,) = report["runs"]
    assert cleaned["num_files_removed"] == 6 and not os.path.lexists(run.checkpoint_dir)
    assert not os.path.lexists(short) and _canary_intact(outside)


def test_an_active_runs_folder_inside_a_finished_runs_folder_is_kept_with_its_reason(world) -> None:
    finished = _finished(world, **{"step-1.pt": 2})
    other = _finished(world, **{"step-1.pt": 3})
    # A manifest may name any storage inside the area: here, the finished run's own folder.
    relative = os.path.relpath(finished.checkpoint_dir, world.policy.tenant_area(world.account.account_id))
    active = new_run(world, booking_id=world.booking(),
                     content=manifest_bytes(checkpoint_policy__storage_uri=f"tenant://{relative}"))
    assert os.path.dirname(active.checkpoint_dir) == finished.checkpoint_dir
    write_file(os.path.join(active.checkpoint_dir, "step-10.pt"), 9)

    report = clean(world, cleanup_ref(world), "clean-key-0001")
    assert [r["run_id"] for r in report["runs"]] == [other.run_id]
    assert report["runs_kept"] == [{
        "run_id": finished.run_id, "num_files_removed": 0, "num_bytes_removed": 0,
        "reason": "holds the checkpoint folder of an active run; kept until that run ends"}]
    assert os.path.getsize(os.path.join(active.checkpoint_dir, "step-10.pt")) == 9
    assert os.path.getsize(os.path.join(finished.checkpoint_dir, "step-1.pt")) == 2
    assert run_row(world, finished.run_id)["cleaned_at"] is None
    (event,) = events(world, "tenant_cleaned")
    assert (event.detail["run_ids"], event.detail["kept_run_ids"]) == ([other.run_id], [finished.run_id])
    # Once the active run ended, the next cleanup removes both.
    finish(world, active)
    again = clean(world, cleanup_ref(world), "clean-key-0002")
    # Each run's files are counted as its own, whichever run id sorts first.
    assert sorted((r["run_id"], r["num_bytes_removed"]) for r in again["runs"]) == sorted(
        [(finished.run_id, 2), (active.run_id, 9)])
    assert again["runs_kept"] == [] and not os.path.lexists(finished.checkpoint_dir)


def _unwritable(folder: str):
    """Make `folder` one whose entries cannot be removed, as root too where chattr works."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o500)
        return lambda: os.chmod(folder, 0o700)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", folder], capture_output=True).returncode:
        pytest.skip("running as root without chattr +i here: no folder root cannot write")
    return lambda: subprocess.run(["chattr", "-i", folder], check=False)


def test_a_folder_that_cannot_be_removed_keeps_its_run_and_the_others_are_cleaned(world) -> None:
    stuck = _finished(world, **{"a.pt": 5, "locked/b.pt": 7})
    fine = _finished(world, **{"c.pt": 11})
    restore = _unwritable(os.path.join(stuck.checkpoint_dir, "locked"))
    try:
        report = clean(world, cleanup_ref(world), "clean-key-0001")
    finally:
        restore()
    assert [r["run_id"] for r in report["runs"]] == [fine.run_id] and not os.path.lexists(fine.checkpoint_dir)
    (kept,) = report["runs_kept"]
    assert kept["run_id"] == stuck.run_id and kept["reason"].startswith("could not be removed whole (E")
    assert kept["reason"].endswith("); kept for a later cleanup") and stuck.checkpoint_dir not in kept["reason"]
    # What it removed before it stopped is counted (a.pt, whichever order the folder lists).
    assert (kept["num_files_removed"], kept["num_bytes_removed"]) in {(0, 0), (1, 5)}
    assert report["num_bytes_removed"] == 11 + kept["num_bytes_removed"]
    assert os.path.getsize(os.path.join(stuck.checkpoint_dir, "locked", "b.pt")) == 7
    assert run_row(world, stuck.run_id)["cleaned_at"] is None
    # Once the folder can be written again, a later cleanup finishes the run.
    again = clean(world, cleanup_ref(world), "clean-key-0002")
    assert [r["run_id"] for r in again["runs"]] == [stuck.run_id] and not os.path.lexists(stuck.checkpoint_dir)


def test_two_cleanups_at_once_clean_each_run_once(world) -> None:
    made = [_finished(world, **{"a.pt": 10}) for _ in range(3)]
    refs = [cleanup_ref(world), cleanup_ref(world)]
    reports = at_once(*(lambda index=index: clean(world, refs[index], f"clean-key-000{index}") for index in range(2)))
    assert all(isinstance(r, dict) for r in reports), reports
    cleaned = [r["run_id"] for report in reports for r in report["runs"]]
    assert sorted(cleaned) == sorted(run.run_id for run in made)  # each once, by one of the two
    assert sum(r["num_bytes_removed"] for r in reports) == 30
    assert len(events(world, "tenant_cleaned")) == 2
    assert all(run_row(world, run.run_id)["state"] == RunState.FAILED.value for run in made)
