"""The sensors left alone for weeks: a Dagster run that ended while the ledger could not hear it,
an end written on a retry, one run that fails every tick, manifest files that misbehave."""

from __future__ import annotations

import logging
import time
import uuid

import dagster as dg
import pytest

from definitions import build_definitions
from control.gate_world import verified
from ito_assets.control import create_run, run_tags, runs, telemetry
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.states import RunState
from ito_assets.defs.workload import outcome
from test_workload_defs import world_and_defs  # noqa: F401 - the ledger and the workload shell, as a fixture


def _create(world, key: str) -> runs.Run:
    now = int(time.time())
    world.booking_id = world.booking(starts_at=now - 3600, ends_at=now + 3600)  # one run per booking
    request = TrainRequest(booking_id=world.booking_id, verified=verified(),
                           confirmation_ref=world.confirm_train(world.booking_id), idempotency_key=key)
    return create_run.create_run(world.ledger, world.policy, world.account, request).run


def _ended_dagster_run(instance, run: runs.Run, status=dg.DagsterRunStatus.FAILURE) -> dg.DagsterRun:
    """The Dagster run the sensor's request became, ended without the ledger hearing of it."""
    dagster_run = dg.DagsterRun(job_name="training_job", run_id=str(uuid.uuid4()), status=status,
                                tags={**run_tags.for_run(run), "dagster/run_key": run.run_id,
                                      "dagster/sensor_name": "confirmed_run_sensor"})
    return instance.add_run(dagster_run)


def _tick(defs, instance, name: str):
    context = dg.build_sensor_context(instance=instance, sensor_name=name, definitions=defs,
                                      resources=defs.resources)
    return defs.resolve_sensor_def(name)(context)


def test_a_run_that_ended_before_it_was_attached_is_ended_in_the_ledger(world_and_defs, instance):
    # The ledger was unreachable both when the authorization step attached the run and when the
    # run-status sensor reported its failure: the ledger run is queued, unattached, its run key spent.
    world, defs = world_and_defs
    run = _create(world, "train-key-0001")
    _ended_dagster_run(instance, run)
    _tick(defs, instance, "cancellation_sensor")
    ended = runs.get(world.ledger, run.run_id)
    assert ended.state is RunState.FAILED  # no longer holding its booking as queued forever
    assert _tick(defs, instance, "confirmed_run_sensor").run_requests == []


def test_a_run_whose_dagster_run_is_still_starting_is_left_queued(world_and_defs, instance):
    world, defs = world_and_defs
    run = _create(world, "train-key-0001")
    _ended_dagster_run(instance, run, status=dg.DagsterRunStatus.STARTING)
    _tick(defs, instance, "cancellation_sensor")
    assert runs.get(world.ledger, run.run_id).state is RunState.QUEUED


def test_one_run_that_fails_every_tick_does_not_stall_the_others(world_and_defs, instance, monkeypatch):
    world, defs = world_and_defs
    stuck, other = _create(world, "train-key-0001"), _create(world, "train-key-0002")
    for run in (stuck, other):
        runs.attach_dagster_run(world.ledger, run.run_id, _ended_dagster_run(instance, run).run_id)
    real = outcome.record_outcome

    def refuses_one(ledger, run_id, **kwargs):
        if run_id == stuck.run_id:
            raise RuntimeError("a row this release cannot write")
        return real(ledger, run_id, **kwargs)

    monkeypatch.setattr(outcome, "record_outcome", refuses_one)
    _tick(defs, instance, "cancellation_sensor")
    assert runs.get(world.ledger, other.run_id).state is RunState.FAILED
    assert runs.get(world.ledger, stuck.run_id).state is RunState.QUEUED  # tried again next tick


def test_an_end_written_on_a_retry_copies_the_event_log_once(world_and_defs, instance, monkeypatch):
    world, defs = world_and_defs
    run = _create(world, "train-key-0001")
    dagster_run = _ended_dagster_run(instance, run)
    instance.report_engine_event("step one ended", dagster_run)
    instance.report_run_failed(dagster_run)
    runs.attach_dagster_run(world.ledger, run.run_id, dagster_run.run_id)
    real = outcome.record_outcome

    def ledger_gone(*args, **kwargs):
        raise OSError("the ledger went away between the log and the end")

    monkeypatch.setattr(outcome, "record_outcome", ledger_gone)
    with pytest.raises(OSError):
        outcome.report_outcome(world.ledger, instance, instance.get_run_by_id(dagster_run.run_id), run.run_id)
    monkeypatch.setattr(outcome, "record_outcome", real)
    _tick(defs, instance, "cancellation_sensor")  # the sweep writes the end later
    assert runs.get(world.ledger, run.run_id).state is RunState.FAILED
    lines = [line.message for line in telemetry.logs(world.ledger, run.run_id, limit=500)]
    assert lines and len(lines) == len(set(lines)), lines


@pytest.mark.parametrize("canary", ["github", "aws", "hugging_face", "slack", "entropy", "jwt"])
def test_a_rejected_file_whose_name_is_a_secret_is_logged_without_it(installation, instance, caplog, canary):
    from helpers import CANARIES

    secret = CANARIES[canary]
    path = installation.manifests_dir / f"{secret}.json"
    path.write_text("{}")
    path.chmod(0o666)  # refused: group- and world-writable
    (installation.manifests_dir / "term\x1b[2J.json").write_text("{}")
    (installation.manifests_dir / "term\x1b[2J.json").chmod(0o666)
    (installation.manifests_dir / "plain-name.json").write_text("{}")
    (installation.manifests_dir / "plain-name.json").chmod(0o666)
    defs = build_definitions(installation.settings, domains=("manifest",))
    context = dg.build_sensor_context(instance=instance, sensor_name="reviewed_manifest_sensor", definitions=defs,
                                      resources=defs.resources)
    context._logger = logging.getLogger("sensor-under-test")  # what the daemon writes to the tick's log
    with caplog.at_level("DEBUG"):
        result = defs.resolve_sensor_def("reviewed_manifest_sensor")(context)
    assert result.run_requests == []
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "'plain-name.json' was not registered: MANIFEST_UNSAFE_PERMISSIONS" in logged
    assert secret not in logged and secret[:12] not in logged and "\x1b" not in logged


def _spent(instance, digest: str) -> None:
    """A run the daemon launched for `digest` (its run key), whatever became of it."""
    instance.add_run(dg.DagsterRun(job_name="preparation_job", run_id=str(uuid.uuid4()),
                                   status=dg.DagsterRunStatus.SUCCESS,
                                   tags={"dagster/run_key": digest, "dagster/sensor_name": "reviewed_manifest_sensor"}))


def test_the_manifest_sensor_stays_bounded_as_the_inbox_grows(installation, instance, monkeypatch):
    # Weeks of reviewed manifests: each tick's requests go into the daemon's tick record and cost
    # it one query each, so a tick asks only for what was never launched, a bounded number at once.
    from sensors import manifests

    monkeypatch.setattr(manifests, "MAX_REQUESTS_PER_TICK", 3)
    for name in ("alpha", "beta", "gamma", "delta", "epsilon"):
        installation.manifest(name)
    defs = build_definitions(installation.settings, domains=("manifest",))
    first = _tick(defs, instance, "reviewed_manifest_sensor")
    assert len(first.run_requests) == 3
    (added,) = first.dynamic_partitions_requests
    assert len(added.partition_keys) == 5  # every manifest is registered at once; runs follow
    instance.add_dynamic_partitions("manifests", list(added.partition_keys))
    for request in first.run_requests:
        _spent(instance, request.run_key)
    second = _tick(defs, instance, "reviewed_manifest_sensor")
    assert len(second.run_requests) == 3
    asked = {r.run_key for r in second.run_requests}
    assert len(asked - {r.run_key for r in first.run_requests}) == 2  # the two never launched come first


def test_the_sweep_reaches_an_ended_run_behind_a_hundred_long_lived_ones(world_and_defs, instance):
    """A desk with more than a hundred runs training for days: the one whose end never reached the
    ledger is the newest, behind the first page the sweep used to read alone."""
    import sqlalchemy as sa

    from ito_assets.control.ledger import runs as runs_table

    world, defs = world_and_defs
    live = _ended_dagster_run(instance, _create(world, "train-key-0001"), status=dg.DagsterRunStatus.STARTED)
    ended = _create(world, "train-key-0002")
    runs.attach_dagster_run(world.ledger, ended.run_id, _ended_dagster_run(instance, ended).run_id)
    with world.ledger.write() as conn:
        template = dict(conn.execute(sa.select(runs_table).where(runs_table.c.run_id == ended.run_id)).mappings().one())
        conn.execute(runs_table.update().where(runs_table.c.run_id == ended.run_id)
                     .values(state="running", updated_at=template["updated_at"] + 10))
        conn.execute(runs_table.insert(), [
            {**template, "run_id": f"run_long{i:022d}", "idempotency_key": f"long-key-{i:04d}", "state": "running",
             "dagster_run_id": live.run_id, "updated_at": template["updated_at"] - 100 + i % 7} for i in range(100)])
    _tick(defs, instance, "cancellation_sensor")
    assert runs.get(world.ledger, ended.run_id).state is RunState.FAILED
    assert runs.get(world.ledger, "run_long" + "0" * 22).state is RunState.RUNNING


def test_the_eval_suite_sensor_asks_a_bounded_number_and_never_a_launched_pair_again(installation, instance,
                                                                                       monkeypatch):
    # A changed suite over an inbox of many decontaminated manifests: each tick asks for at most
    # the bound, and a (manifest, suite) pair already launched is neither asked nor looked up.
    import hashlib

    from ito_assets.manifest import discovery
    from sensors import eval_suite

    found = [discovery.DiscoveredManifest(path=f"m{i}.json", sha256_hex=hashlib.sha256(b"%d" % i).hexdigest())
             for i in range(5)]
    monkeypatch.setattr(eval_suite.discovery, "discover", lambda folder, max_bytes: (found, []))
    looked_up = []  # one bulk look-up a tick, of every manifest's latest report
    monkeypatch.setattr(eval_suite, "_latest_reports", lambda inst, partitions: looked_up.append(set(partitions)) or {
        key: (1, "sha256:" + "0" * 64) for key in partitions})
    monkeypatch.setattr(eval_suite, "MAX_REQUESTS_PER_TICK", 3)
    instance.add_dynamic_partitions("manifests", [m.key for m in found])
    defs = build_definitions(installation.settings, domains=("manifest", "data"))
    asked = []
    for expected in (3, 2, 0):
        looked_up.clear()
        requests = _tick(defs, instance, "eval_suite_changed").run_requests
        assert len(requests) == expected and looked_up == [{m.key for m in found}]
        assert not {r.run_key for r in requests} & set(asked)
        for request in requests:
            instance.add_run(dg.DagsterRun(job_name="decontamination_job", run_id=str(uuid.uuid4()),
                                           status=dg.DagsterRunStatus.SUCCESS,
                                           tags={"dagster/run_key": request.run_key,
                                                 "dagster/sensor_name": "eval_suite_changed"}))
            asked.append(request.run_key)
    assert len(set(asked)) == 5
