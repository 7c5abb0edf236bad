"""`ito metrics`, `logs` and `status --watch` against a real `ito serve`, fed what a hostile or
diverged run leaves: every --json answer is one strict JSON document with a stable code."""

from __future__ import annotations

import contextlib
import http.server
import json
import math
from typing import Iterator

import pytest

from api_harness import ito_subprocess
from helpers import loopback_server
from ito_assets.control.ledger import open_ledger, run_metrics


def _strict(text: str) -> dict:
    """One JSON document on one line, with no NaN or Infinity (which are not JSON)."""
    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    [line] = text.splitlines()
    return json.loads(line, parse_constant=refuse)


def test_a_non_finite_metric_row_does_not_break_the_listing(api) -> None:
    _booking, run = api.started_run()
    ledger = open_ledger(f"sqlite:///{api.server.ledger_path}", create=False)
    try:
        with ledger.write() as conn:  # as an older release stored them: SQLite keeps infinities
            for step, value in ((1, math.inf), (2, 2.5)):
                conn.execute(run_metrics.insert().values(run_id=run, step=step, name="loss", value=value, at=0))
    finally:
        ledger.dispose()
    done = ito_subprocess(api.env("account"), "metrics", run, "--json")
    document = _strict(done.stdout)
    assert done.returncode == 0, document
    assert [m["value"] for m in document["data"]["metrics"]] == [None, 2.5]
    readable = ito_subprocess(api.env("account"), "metrics", run)
    assert readable.returncode == 0 and "value=None" in readable.stdout


@pytest.mark.parametrize("flags", [("--max-wait", "nan"), ("--interval", "nan"), ("--max-wait", "inf"),
                                   ("--interval", "inf"), ("--interval", "-inf")])
def test_watch_refuses_a_wait_that_is_not_a_finite_number(api, flags) -> None:
    """A NaN --max-wait is never reached (the watch polled forever); an infinite --interval
    overflowed time.sleep into INTERNAL_ERROR."""
    _booking, run = api.started_run()
    done = ito_subprocess(api.env("account"), "status", run, "--watch", *flags, "--json", timeout=20)
    document = _strict(done.stdout)
    assert done.returncode == 2 and document["error"]["code"] == "USAGE_ERROR"
    assert document["live_api_contacted"] is False


@contextlib.contextmanager
def _answering(body: bytes) -> Iterator[str]:
    """A loopback server that answers every GET with `body`, status 200."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:
            pass

    with loopback_server(Handler) as url:
        yield url


@pytest.mark.parametrize("data", [b'{"run_id": "run_x", "loss": NaN, "terminal": true}',
                                  b'{"run_id": "run_x", "loss": 1e400}',
                                  b'{"run_id": "run_x", "n": 1' + b"0" * 5000 + b"}",
                                  b'{"run_id": "run_x", "d": ' + b"[" * 5000 + b"]" * 5000 + b"}"])
def test_an_answer_that_is_not_strict_json_is_a_stable_code_not_a_traceback(api, data) -> None:
    """Python's json reads NaN and 1e400 (then the --json envelope could not be printed: a
    traceback and no document) and raises errors of its own past its digit and nesting limits
    (INTERNAL_ERROR, and live_api_contacted false though an answer came)."""
    with _answering(b'{"ok": true, "data": ' + data + b"}") as url:
        done = ito_subprocess({**api.env("account"), "ITO_API_URL": url}, "status", "run_" + "0" * 26, "--json",
                              timeout=30)
    document = _strict(done.stdout)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert document["error"]["code"] == "API_UNREACHABLE" and document["live_api_contacted"] is True
    assert "not the ito API" in document["error"]["message"]


def test_a_watch_that_stops_at_max_wait_says_so_in_both_modes(api) -> None:
    _booking, run = api.started_run()  # queued, and nothing launches it here
    args = ("status", run, "--watch", "--interval", "0.1", "--max-wait", "0.5")
    document = _strict(ito_subprocess(api.env("account"), *args, "--json").stdout)
    assert document["ok"] and document["notice"] == "polling stopped before the run ended (--max-wait)"
    readable = ito_subprocess(api.env("account"), *args)
    assert readable.returncode == 0 and "state: queued" in readable.stdout
    assert "notice: polling stopped before the run ended (--max-wait)" in readable.stdout
