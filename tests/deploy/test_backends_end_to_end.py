"""The end-to-end flow once on each backend, SQLite and PostgreSQL.

On each: a real `ito serve` on the backend's ledger and a Dagster instance from the matching
`deploy/` dagster.yaml. Through the `ito` client the desk books, the account confirms, the desk
approves, the account trains and reads its status; the daemon's sensors launch the training job on
the instance (the workload domain: the ledger's re-authorization), and its end reaches `ito status`.
A second run is cancelled after the daemon created its Dagster run and before that run started:
`ito status` reads cancelled at once, and the cancellation sensor withdraws the Dagster run.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import dagster as dg
import pytest

from api.api_harness import Client, Server  # tests/api: the real `ito serve` and client
from definitions import build_definitions
from helpers import postgres_dagster_instance, postgres_url_or_skip
from ito_assets.control.run_tags import RUN_ID as RUN_ID_TAG
from ito_assets.local_run import RunSummary, evaluate_sensor

ROOT = Path(__file__).resolve().parents[2]


def _sqlite(root: Path, monkeypatch) -> tuple[dict, dg.DagsterInstance]:
    home = root / "dagster"
    home.mkdir()
    shutil.copy(ROOT / "deploy/local/dagster.yaml", home / "dagster.yaml")
    ledger = {"ITO_LEDGER_URL": f"sqlite:///{root / 'ledger.db'}"}
    return ledger, dg.DagsterInstance.from_config(str(home))


def _postgres(root: Path, monkeypatch, request) -> tuple[dict, dg.DagsterInstance]:
    import psycopg

    url = postgres_url_or_skip()
    database, schema = f"ito_e2e_{uuid.uuid4().hex[:10]}", f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')

    def drop() -> None:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    request.addfinalizer(drop)
    instance = postgres_dagster_instance(root / "dagster", database, monkeypatch)
    ledger = {"ITO_LEDGER_URL": url.replace("postgresql://", "postgresql+psycopg://", 1), "ITO_LEDGER_SCHEMA": schema}
    return ledger, instance


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, installation, monkeypatch):
    root = Path(os.path.realpath(installation.root)) / request.param
    root.mkdir()
    make = _sqlite if request.param == "sqlite" else lambda r, m: _postgres(r, m, request)
    ledger_env, instance = make(root, monkeypatch)
    server = Server(root / "server", **ledger_env)
    # The code location reads the ledger from the environment, as a deployment does.
    for name, value in ledger_env.items():
        monkeypatch.setenv(name, value)
    settings = installation.settings.with_overrides(ledger_url=ledger_env["ITO_LEDGER_URL"],
                                                   ledger_schema=ledger_env.get("ITO_LEDGER_SCHEMA"),
                                                   ledger_url_env="ITO_LEDGER_URL", executor="in_process")
    defs = build_definitions(settings, domains=("manifest", "workload"))
    try:
        yield Client(server, root / "client"), defs, instance
    finally:
        server.stop()
        instance.dispose()


def _tick(defs, instance, name: str) -> RunSummary:
    summary = RunSummary()
    evaluate_sensor(defs, instance, name, summary)
    return summary


def _created_like_the_daemon(defs, instance, run_id: str) -> dg.DagsterRun:
    """The Dagster run the daemon creates from the sensor's request, before it starts a step."""
    request = next(r for r in defs.resolve_sensor_def("confirmed_run_sensor")(
        dg.build_sensor_context(instance=instance, definitions=defs, resources=defs.resources)).run_requests
        if r.run_key == run_id)
    job = defs.resolve_job_def("training_job")
    run = instance.create_run_for_job(job, tags={**request.tags, "dagster/partition": request.partition_key},
                                      status=dg.DagsterRunStatus.NOT_STARTED)
    return run


def test_desk_confirm_train_status_cancel_on_each_backend(backend) -> None:
    api, defs, instance = backend
    booking = api.booking()
    manifest = api.manifest()
    first = api.train(booking, manifest, api.confirm_train(booking, manifest), "e2e-train-0001")
    assert first["ok"] and first["data"]["state"] == "queued", first
    run_id = first["data"]["run_id"]
    assert api.ok("status", run_id)["state"] == "queued"

    launched = _tick(defs, instance, "confirmed_run_sensor")
    assert launched.num_runs_launched == 1 and launched.num_runs_failed == 0, launched
    assert api.ok("status", run_id)["state"] == "succeeded"
    (dagster_run,) = instance.get_runs(filters=dg.RunsFilter(tags={RUN_ID_TAG: run_id}))
    assert dagster_run.status is dg.DagsterRunStatus.SUCCESS
    logs = "\n".join(line["message"] for line in api.ok("logs", run_id, "--limit", "500")["logs"])
    assert "RUN_SUCCESS" in logs

    second_manifest = api.manifest()
    second = api.ok("train", "--booking", booking, "--manifest", second_manifest, "--confirmation-ref",
                    api.confirm_train(booking, second_manifest), "--idempotency-key", "e2e-train-0002")
    waiting = _created_like_the_daemon(defs, instance, second["run_id"])
    cancel_ref = api.ok("confirm", "request", "--action", "cancel", "--run", second["run_id"])["confirmation_ref"]
    api.approve(cancel_ref)
    # Not started yet: the ledger ends the run at once; the waiting Dagster run is withdrawn.
    assert api.ok("cancel", second["run_id"], "--confirmation-ref", cancel_ref,
                  "--idempotency-key", "e2e-cancel-001")["state"] == "cancelled"
    assert api.ok("status", second["run_id"])["state"] == "cancelled"
    _tick(defs, instance, "cancellation_sensor")
    assert instance.get_run_by_id(waiting.run_id).status is dg.DagsterRunStatus.CANCELED
    assert _tick(defs, instance, "confirmed_run_sensor").num_runs_launched == 0  # nothing pending is left
    assert api.ok("status", run_id)["state"] == "succeeded"
