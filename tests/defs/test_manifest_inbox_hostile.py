"""The reviewed-manifest sensor over a hostile inbox, tick after tick: links, FIFOs, a huge file,
a partial file, a secret canary, odd names, many refused files, a file gone between the listing and
the read, a folder that cannot be listed. The tick never fails, each refused file is logged by its
code once (not on every tick), and the canary is never logged nor kept in the cursor."""

from __future__ import annotations

import logging
import os
import shutil

import dagster as dg
import pytest

from helpers import ManifestSensorTicks, write_manifest
from ito_assets.manifest import discovery

CANARY = "sk-canary-0123456789abcdef0123456789abcdef"
SENSOR = "reviewed_manifest_sensor"


def Ticks(installation, instance, caplog) -> ManifestSensorTicks:
    """The sensor tick after tick; each tick's warnings."""
    return ManifestSensorTicks(installation, instance, caplog, level=logging.WARNING)


def _refused(path, content: bytes = b"{}") -> None:
    path.write_bytes(content)
    path.chmod(0o666)  # group- and world-writable: MANIFEST_UNSAFE_PERMISSIONS


def test_each_refused_file_is_logged_once_by_its_code_and_never_every_tick(installation, instance, caplog):
    inbox = installation.manifests_dir
    good = installation.manifest("good")
    shutil.copy(good, inbox / "same-bytes.json")  # two files, one manifest: one partition, one request
    os.chmod(inbox / "same-bytes.json", 0o600)
    os.symlink(good, inbox / "link.json")
    os.mkfifo(inbox / "fifo.json")
    with open(inbox / "huge.json", "wb") as handle:
        handle.truncate(2 << 30)  # sparse: 2 GiB on paper, nothing on disk
    os.chmod(inbox / "huge.json", 0o600)
    _refused(inbox / "secret.json", b'{"token": "' + CANARY.encode() + b'"}')
    with open(os.fsencode(inbox) + b"/new\nline-\xff.json", "wb") as handle:
        handle.write(b"{}")
    os.chmod(os.fsencode(inbox) + b"/new\nline-\xff.json", 0o666)
    ticks = Ticks(installation, instance, caplog)

    first, warnings = ticks.tick()
    assert sorted(warnings) == sorted([
        "manifest file 'fifo.json' was not registered: MANIFEST_NOT_REGULAR",
        "manifest file 'huge.json' was not registered: MANIFEST_TOO_LARGE",
        "manifest file 'link.json' was not registered: MANIFEST_SYMLINK",
        "manifest file 'new\\nline-\\udcff.json' was not registered: MANIFEST_UNSAFE_PERMISSIONS",
        "manifest file 'secret.json' was not registered: MANIFEST_UNSAFE_PERMISSIONS",
    ])
    assert len(first.run_requests) == 1
    assert CANARY not in first.cursor and "secret" not in first.cursor and "fifo" not in first.cursor

    _launched(instance, first.run_requests[0].run_key)  # as the daemon does with the request
    # The next ticks log nothing while the inbox stays as it is.
    again, warnings = ticks.tick()
    assert warnings == [] and len(again.run_requests) == 1
    assert ticks.tick()[1] == []
    # A new refused file is logged alone; a refused file that changes its code is logged again.
    _refused(inbox / "later.json")
    os.chmod(inbox / "secret.json", 0o600)
    (inbox / "fifo.json").unlink()
    (inbox / "fifo.json").mkdir()
    _, warnings = ticks.tick()
    assert sorted(warnings) == ["manifest file 'later.json' was not registered: MANIFEST_UNSAFE_PERMISSIONS"]
    # A file removed and put back is logged again: the cursor forgets what left the inbox.
    (inbox / "later.json").unlink()
    assert ticks.tick()[1] == []
    _refused(inbox / "later.json")
    assert ticks.tick()[1] == ["manifest file 'later.json' was not registered: MANIFEST_UNSAFE_PERMISSIONS"]
    assert CANARY not in "\n".join(r.getMessage() for r in caplog.records)


def test_many_refused_files_are_logged_a_bounded_number_a_tick(installation, instance, caplog, monkeypatch):
    from sensors import manifests

    monkeypatch.setattr(manifests, "MAX_REPORTS_PER_TICK", 3)
    for index in range(5):
        _refused(installation.manifests_dir / f"bad-{index}.json")
    ticks = Ticks(installation, instance, caplog)
    _, first = ticks.tick()
    assert len(first) == 4 and first[-1] == (
        "2 more manifest files were not registered (MANIFEST_UNSAFE_PERMISSIONS x2); named on the next ticks")
    _, second = ticks.tick()
    assert len(second) == 2 and not set(first) & set(second)
    assert ticks.tick()[1] == []


def test_a_file_gone_between_the_listing_and_the_read_is_logged_once(installation, instance, caplog, monkeypatch):
    doomed = write_manifest(installation.manifests_dir / "doomed.json", {"name": "x"})
    real = discovery.read_manifest_bytes

    def deleted_first(path, **kwargs):
        if path == doomed and os.path.exists(doomed):
            os.unlink(doomed)
        return real(path, **kwargs)
    monkeypatch.setattr(discovery, "read_manifest_bytes", deleted_first)
    ticks = Ticks(installation, instance, caplog)
    result, warnings = ticks.tick()
    assert warnings == ["manifest file 'doomed.json' was not registered: MANIFEST_NOT_FOUND"]
    assert result.run_requests == [] and ticks.tick()[1] == []


def test_a_folder_that_cannot_be_listed_skips_the_tick_and_keeps_the_cursor(installation, instance, caplog,
                                                                            monkeypatch):
    _refused(installation.manifests_dir / "bad.json")
    ticks = Ticks(installation, instance, caplog)
    ticks.tick()
    kept = ticks.cursor

    def unreadable(_folder, **_kwargs):
        raise PermissionError(13, "Permission denied", str(installation.manifests_dir))
    monkeypatch.setattr(discovery, "scan", unreadable)
    result, warnings = ticks.tick()
    assert warnings == ["the manifests folder could not be listed (PermissionError); tried again on the next tick"]
    assert result.run_requests == [] and ticks.cursor == kept
    monkeypatch.undo()
    assert ticks.tick()[1] == []  # the refused file was logged already


@pytest.mark.parametrize("cursor", ["not json", "[1, 2]", '{"reported": 7}', '{"reported": [1, "x"]}'])
def test_a_cursor_of_another_form_logs_everything_once_more(installation, instance, caplog, cursor):
    _refused(installation.manifests_dir / "bad.json")
    ticks = Ticks(installation, instance, caplog)
    ticks.cursor = cursor
    assert len(ticks.tick()[1]) == 1 and ticks.tick()[1] == []


def _launched(instance, digest: str) -> str:
    """The run the daemon made of a request (its run key the manifest's digest); its id."""
    import uuid

    run_id = str(uuid.uuid4())
    instance.add_run(dg.DagsterRun(job_name="preparation_job", run_id=run_id, status=dg.DagsterRunStatus.SUCCESS,
                                   tags={"dagster/run_key": digest, "dagster/sensor_name": SENSOR}))
    return run_id


def test_a_manifest_whose_run_was_deleted_is_not_prepared_again(installation, instance, caplog):
    """The daemon skips a request whose run key a stored run holds: a person deleting an old run to
    tidy the UI freed its key, and the next tick prepared the manifest again, proxies and all."""
    path = installation.manifest("alpha")
    ticks = Ticks(installation, instance, caplog)
    (request,) = ticks.tick()[0].run_requests
    run_id = _launched(instance, request.run_key)
    assert [r.run_key for r in ticks.tick()[0].run_requests] == [request.run_key]  # asked again: costs nothing
    instance.delete_run(run_id)
    assert ticks.tick()[0].run_requests == []
    assert ticks.tick()[0].run_requests == []
    # Taken out of the inbox and put back, it is a new arrival: prepared again.
    content = open(path, "rb").read()
    os.remove(path)
    assert ticks.tick()[0].run_requests == []
    with open(path, "wb") as handle:
        handle.write(content)
    os.chmod(path, 0o600)
    assert [r.run_key for r in ticks.tick()[0].run_requests] == [request.run_key]


@pytest.mark.parametrize("cursor", [None, '{"reported": []}', "[" * 100_000])
def test_a_cursor_without_requests_asks_for_every_manifest_without_a_run(installation, instance, caplog, cursor):
    """An older release's cursor (or none, or one nested past the parser's depth) lists no request."""
    installation.manifest("alpha")
    ticks = Ticks(installation, instance, caplog)
    ticks.cursor = cursor
    assert len(ticks.tick()[0].run_requests) == 1
