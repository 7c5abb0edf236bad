"""Runs a command executes in its own process: a run whose process was killed is marked failed,
and the pool slot it held freed, before the next in-process run; a live one is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import sqlite3
import subprocess
import signal
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from ito_assets.defs.in_process_runs import PROCESS_TAG, _start_time, fail_orphaned_runs, process_tags, wait_for_pool
from ito_assets.settings import PROJECT_ROOT

POOL = "duckdb_writer"


@pytest.fixture
def instance(tmp_path: Path):
    """An instance configured as `make run` configures one: every pool holds one slot."""
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text((PROJECT_ROOT / "deploy" / "local" / "dagster.yaml").read_text())
    with dg.DagsterInstance.from_config(str(home)) as local:
        assert local.event_log_storage.initialize_concurrency_limit_to_default(POOL)  # as a step's first claim does
        assert local.event_log_storage.get_concurrency_info(POOL).slot_count == 1
        yield local


@dg.op
def noop() -> None:
    pass


@dg.job
def some_job() -> None:
    noop()


def _dead_process_tag() -> str:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = _start_time(child.pid)
    child.kill()
    child.wait()
    return f"{socket.gethostname()}:{child.pid}:{start or ''}"


def _started_run(instance: dg.DagsterInstance, process: str) -> str:
    """A STARTED run tagged with `process`, holding the pool's one slot for its step."""
    run = instance.create_run_for_job(some_job, tags={PROCESS_TAG: process}, status=dg.DagsterRunStatus.STARTED)
    claim = instance.event_log_storage.claim_concurrency_slot(POOL, run.run_id, "noop")
    assert claim.is_claimed
    return run.run_id


def _slots_held(instance: dg.DagsterInstance) -> int:
    return instance.event_log_storage.get_concurrency_info(POOL).active_slot_count


def test_a_killed_process_s_run_is_failed_and_its_pool_slot_freed(instance) -> None:
    orphan = _started_run(instance, _dead_process_tag())
    assert _slots_held(instance) == 1
    blocked = instance.event_log_storage.claim_concurrency_slot(POOL, "next-run", "noop")
    assert not blocked.is_claimed  # what a later run waited on for good
    assert fail_orphaned_runs(instance) == [orphan]
    assert instance.get_run_by_id(orphan).status is dg.DagsterRunStatus.FAILURE
    assert _slots_held(instance) == 0
    assert fail_orphaned_runs(instance) == []  # failed once: a second sweep finds nothing


@pytest.mark.parametrize("process", [
    "this",  # the live process executing it
    f"{socket.gethostname()}:no-pid:",  # a tag this module did not write
    "another-host.example:1:1",  # another machine's process: not ours to judge
])
def test_a_run_whose_process_may_live_is_left_alone(instance, process) -> None:
    run_id = _started_run(instance, process_tags()[PROCESS_TAG] if process == "this" else process)
    assert fail_orphaned_runs(instance) == []
    assert instance.get_run_by_id(run_id).status is dg.DagsterRunStatus.STARTED and _slots_held(instance) == 1


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="start times come from /proc")
def test_a_reused_pid_is_not_taken_for_the_run_s_process(instance) -> None:
    """The pid of the run's process is alive again, but its start time is another process's."""
    host, pid, start = process_tags()[PROCESS_TAG].split(":")
    run_id = _started_run(instance, f"{host}:{pid}:{int(start) - 1}")
    assert fail_orphaned_runs(instance) == [run_id]


def test_the_tag_names_this_host_pid_and_start() -> None:
    host, pid, start = process_tags()[PROCESS_TAG].split(":")
    assert host == socket.gethostname() and int(pid) == os.getpid()
    assert start == (_start_time(os.getpid()) or "")


def test_with_the_pool_free_there_is_no_wait(instance) -> None:
    said = []
    wait_for_pool(instance, POOL, say=said.append, poll_s=60)
    assert said == []


def test_a_live_holder_is_waited_for_and_named_once(instance) -> None:
    holder = _started_run(instance, "another-host.example:1:1")
    said = []
    release = threading.Timer(0.3, lambda: instance.event_log_storage.free_concurrency_slots_for_run(holder))
    release.start()
    started = time.monotonic()
    wait_for_pool(instance, POOL, say=said.append, poll_s=0.02)
    assert time.monotonic() - started >= 0.3
    assert len(said) == 1 and holder in said[0] and "Ctrl-C" in said[0]


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, None])
def test_a_claim_that_outlived_its_run_is_freed_not_waited_for(instance, status) -> None:
    # A claim left behind by a run that ended (or by one deleted from the instance) would hold
    # the slot for good: freed, not waited for.
    holder = "deleted-run" if status is None else instance.create_run_for_job(some_job, status=status).run_id
    assert instance.event_log_storage.claim_concurrency_slot(POOL, holder, "noop").is_claimed
    said = []
    wait_for_pool(instance, POOL, say=said.append, poll_s=60)
    assert said == [] and _slots_held(instance) == 0


@pytest.mark.parametrize("reaped", [True, False])  # a zombie, killed and not yet reaped, runs no more
def test_a_holder_killed_during_the_wait_ends_the_wait(instance, reaped) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = _started_run(instance, f"{socket.gethostname()}:{child.pid}:{_start_time(child.pid) or ''}")
        threading.Timer(0.3, lambda: (child.kill(), reaped and child.wait())).start()
        wait_for_pool(instance, POOL, say=lambda line: None, poll_s=0.02)
    finally:
        child.kill()
        child.wait()
    assert instance.get_run_by_id(holder).status is dg.DagsterRunStatus.FAILURE and _slots_held(instance) == 0


@pytest.mark.slow
def test_ito_data_prepare_killed_while_its_step_holds_the_pool_then_run_again_finishes(tmp_path: Path) -> None:
    """As a user meets it: `ito data prepare` killed (SIGKILL) while a data step holds the
    `duckdb_writer` slot; the next `ito data prepare` on the same state used to wait for that slot
    forever. It now finishes, and the killed run is failed in the instance."""
    rng = random.Random(1)
    records = [{"id": f"doc-{i}", "text": " ".join(f"w{rng.randrange(400)}" for _ in range(80))} for i in range(300)]
    item = {"id": "t/1", "benchmark": "trivia", "question": "Which built-in exception is raised when you look up a key in a "
            "dictionary that does not contain that key at all?", "answer": "KeyError"}
    for name, rows in (("corpus.jsonl", records), ("suite.jsonl", [{"suite_id": "my-evals-v1"}, item])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "ITO_STATE_DIR": str(tmp_path / "state"), "DAGSTER_HOME": str(tmp_path / "dagster")}
    argv = [sys.executable, "-m", "ito_assets.api.cli", "data", "prepare", "--corpus", str(tmp_path / "corpus.jsonl"),
            "--eval-suite", str(tmp_path / "suite.jsonl"), "--license", "CC0-1.0", "--json"]
    first = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        held = _wait_for_a_held_slot(tmp_path / "dagster", first)
    finally:
        first.kill()
        first.wait()
    assert held, "the first run ended before any step held the pool"
    _interrupted_while_a_live_run_holds_the_pool(tmp_path / "dagster", argv, env, tmp_path)
    again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)  # it never ended before
    document = json.loads(again.stdout)
    assert again.returncode == 0 and document["ok"], document
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        statuses = sorted(r.status.value for r in instance.get_runs())
        assert statuses == ["FAILURE", "FAILURE", "SUCCESS"] and _slots_held(instance) == 0


def _interrupted_while_a_live_run_holds_the_pool(home: Path, argv: list[str], env: dict, cwd: Path) -> None:
    """Another machine's live run holds the slot: the command frees the killed run's slot, says it
    waits for the live one, and Ctrl-C ends it at once (Dagster's own wait ignored it)."""
    with dg.DagsterInstance.from_config(str(home)) as local:
        # It queues behind the killed run's claim, then holds the slot once the command frees that.
        holder = local.create_run_for_job(some_job, tags={PROCESS_TAG: "another-host.example:1:1"},
                                          status=dg.DagsterRunStatus.STARTED).run_id
        local.event_log_storage.claim_concurrency_slot(POOL, holder, "noop")
        # As from a terminal: Ctrl-C's signal not ignored, whatever this test's own launcher set
        # (a shell starts a background job with SIGINT ignored, and a child inherits that).
        waiting = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            line = waiting.stderr.readline()  # the first line it writes, once it waits
            assert "waiting for the 'duckdb_writer' pool" in line and holder in line, line
            waiting.send_signal(signal.SIGINT)
            out, err = waiting.communicate(timeout=30)
        finally:
            waiting.kill()
            waiting.wait()
        assert waiting.returncode == 130 and out == "" and err.strip() == "ito: interrupted", (out, err)
        local.report_run_failed(local.get_run_by_id(holder))
        local.event_log_storage.free_concurrency_slots_for_run(holder)


def _wait_for_a_held_slot(home: Path, process: subprocess.Popen) -> bool:
    """Poll until a step of the running command holds the pool's slot (True), or the command ends
    first (False). The event log's index is read as a plain SQLite file, read-only: opening the
    instance here while the command creates its storage would race its schema migrations."""
    index = home / "history" / "runs" / "index.db"
    while process.poll() is None:
        if index.exists():
            try:
                with contextlib.closing(sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=1)) as db:
                    held = db.execute("SELECT count(*) FROM concurrency_slots WHERE concurrency_key = ? AND run_id IS NOT NULL",
                                      (POOL,)).fetchone()[0]
                if held:
                    return True
            except sqlite3.OperationalError:  # the table is not there yet, or the file is locked a moment
                pass
        time.sleep(0.1)
    return False
