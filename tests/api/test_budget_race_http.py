"""The budget race on the wire: 16 concurrent raw POST /v1/runs to a real `ito serve` (on a
SQLite and on a PostgreSQL ledger), each with
its own booking, approved confirmation and key, against a cap that fits 3 runs. Every answer is
counted as the server sent it (no client retry in between): exactly 3 runs, 13 BUDGET_EXCEEDED,
never IDEMPOTENCY_KEY_IN_FLIGHT."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ito_assets.api.commands.confirm import read_manifest_for_upload
from test_postgres_server import pg_api  # noqa: F401 - the fixture of a server on a PostgreSQL ledger

CALLERS, FIT = 16, 3
COST = 100 * 8 * 48  # the harness's bookings: 100 cents x 8 GPUs x 48 booked hours


def _post(url: str, token: str, body: dict) -> tuple[int, dict]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", "/v1/runs", body=json.dumps(body),
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request):
    return request.getfixturevalue("api" if request.param == "sqlite" else "pg_api")


def test_sixteen_trains_on_sixteen_bookings_fit_the_cap_as_the_wire_shows(served) -> None:
    api = served
    manifest = api.manifest(budget={"cap_cents": FIT * COST, "max_incremental_cents": COST})
    bookings = [api.booking() for _ in range(CALLERS)]
    refs = [api.confirm_train(booking, manifest) for booking in bookings]
    digest, content = read_manifest_for_upload(manifest)
    token = Path(api.tokens["account"]).read_text().strip()
    barrier = threading.Barrier(CALLERS)

    def call(index: int) -> tuple[int, dict]:
        body = {"booking_id": bookings[index], "manifest_digest": digest, "manifest_b64": content,
                "confirmation_ref": refs[index], "idempotency_key": api.unique("wire")}
        barrier.wait()
        return _post(api.server.url, token, body)

    with ThreadPoolExecutor(max_workers=CALLERS) as pool:
        answers = list(pool.map(call, range(CALLERS)))
    statuses = Counter(status for status, _ in answers)
    codes = Counter(doc["error"]["code"] for _, doc in answers if not doc["ok"])
    assert statuses == Counter({200: FIT, 422: CALLERS - FIT}), answers
    assert codes == Counter({"BUDGET_EXCEEDED": CALLERS - FIT})
    [budget] = api.ok("budget", "--manifest", digest)["budgets"]
    assert budget["committed_cents"] == FIT * COST <= budget["cap_cents"] and budget["num_runs"] == FIT
