"""`ito metrics`, `logs` and `status --watch` against a real `ito serve`, fed what a hostile or
diverged run leaves: every --json answer is one strict JSON document with a stable code."""

from __future__ import annotations

import json
import math

import pytest

from api_harness import ito_subprocess
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
