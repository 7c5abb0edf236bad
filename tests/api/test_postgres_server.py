"""`ito serve` on a PostgreSQL ledger (its own schema): the flow and the same-key race."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from api_harness import Client, Server, environment, map_in_forked_callers
from ito_assets.api import cli

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
NUM_CALLERS = 16


def _pg_reason() -> str | None:
    try:
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", connect_timeout=2):
            return None
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL on 127.0.0.1:5432 is not reachable ({type(exc).__name__}); Postgres server tests skipped"


pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg_api(tmp_path_factory):
    reason = _pg_reason()
    if reason:
        pytest.skip(reason)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    root = Path(os.path.realpath(tmp_path_factory.mktemp("pg")))
    server = Server(root / "server", ITO_LEDGER_URL=PG_URL, ITO_LEDGER_SCHEMA=schema)
    try:
        yield Client(server, root / "client")
    finally:
        server.stop()
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _call(job):
    env, argv = job
    with environment(env):
        document, _ = cli.run(argv)
    return document


def test_flow_and_same_key_race_on_postgres(pg_api) -> None:
    booking, manifest = pg_api.booking(), pg_api.manifest()
    ref = pg_api.confirm_train(booking, manifest)
    argv = ["train", "--booking", booking, "--manifest", manifest, "--confirmation-ref", ref,
            "--idempotency-key", "pg-same-key-01", "--json"]
    results = map_in_forked_callers(_call, [(pg_api.env("account"), argv)] * NUM_CALLERS, NUM_CALLERS)
    assert all(r["ok"] for r in results), [r.get("error") for r in results if not r["ok"]][:3]
    assert len({r["data"]["run_id"] for r in results}) == 1
    run_id = results[0]["data"]["run_id"]
    assert pg_api.ok("status", "--idempotency-key", "pg-same-key-01")["run_id"] == run_id
    again = pg_api.train(booking, manifest, ref, "pg-other-key-1")
    assert again["error"]["code"] == "CONFIRMATION_CONSUMED"


def test_odd_and_long_booking_ids_are_not_found_never_a_500_on_postgres(pg_api) -> None:
    from test_error_codes import LONG_BOOKING_IDS, refused_train_codes

    assert refused_train_codes(pg_api) == [code for _, code in LONG_BOOKING_IDS] + ["BOOKING_NOT_FOUND"] * 2
