"""The ledger's telemetry under values a run really produces: a diverged loss (NaN, infinity), a
log decoded from bytes that are not UTF-8, a NUL, a message past the length bound with a
credential at the cut. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import math

from helpers import CANARIES
from ito_assets.control import history, telemetry
from ito_assets.control.ledger import run_metrics
from test_lifecycle import make_run


def test_non_finite_metrics_are_logged_not_stored_and_publish_goes_on(world) -> None:
    run = make_run(world)
    figures = [(10, "pretraining/loss", math.nan), (20, "pretraining/loss", math.inf),
               (20, "pretraining/gate_delta", -math.inf), (30, "pretraining/big", 2 ** 1100),
               (30, "pretraining/loss", 2.5)]
    added = telemetry.publish(world.ledger, run.run_id, [], figures)
    stored = telemetry.every_page(telemetry.metrics, world.ledger, run.run_id)
    assert added == (0, 1) and [(m.step, m.name, m.value) for m in stored] == [(30, "pretraining/loss", 2.5)]
    warnings = [line.message for line in telemetry.every_page(telemetry.logs, world.ledger, run.run_id)]
    assert len(warnings) == 4 and all("not a finite number" in w for w in warnings)
    assert "(nan)" in warnings[0] and "(inf)" in warnings[1] and "(-inf)" in warnings[2]
    json.dumps(telemetry.as_dicts(stored), allow_nan=False)


def test_a_step_past_the_ledgers_64_bits_is_logged_not_stored_and_the_rest_is(world) -> None:
    """One such row failed the whole transaction: every figure of a stage's publication lost."""
    import numpy as np

    run = make_run(world)
    figures = [(2**63 - 1, "a", 1.0), (2**63, "b", 2.0), (-(2**63), "c", 3.0), (-(2**63) - 1, "d", 4.0),
               (10**5000, "e", 5.0), ("7", "f", 6.0), (np.int64(5), "g", 7.0)]
    assert telemetry.publish(world.ledger, run.run_id, [], figures) == (0, 3)
    stored = telemetry.every_page(telemetry.metrics, world.ledger, run.run_id)
    assert [(m.step, m.name) for m in stored] == [(2**63 - 1, "a"), (-(2**63), "c"), (5, "g")]
    warnings = [line.message for line in telemetry.every_page(telemetry.logs, world.ledger, run.run_id)]
    assert len(warnings) == 4 and all("past the ledger's range" in w for w in warnings)


def test_a_non_finite_row_already_in_the_ledger_reads_as_null(world) -> None:
    """A row written before non-finite values were refused (SQLite holds infinities, PostgreSQL
    NaN too): the listing stays strict JSON, and the rest of the page is served."""
    run = make_run(world)
    with world.ledger.write() as conn:
        for step, value in ((1, math.inf), (2, -math.inf), (3, 1.5)):
            conn.execute(run_metrics.insert().values(run_id=run.run_id, step=step, name="loss", value=value, at=0))
    page = telemetry.as_dicts(telemetry.metrics(world.ledger, run.run_id))
    assert [m["value"] for m in page] == [None, None, 1.5]
    json.dumps(page, allow_nan=False)


def test_the_desk_quote_is_not_voided_by_a_diverged_run(world) -> None:
    """The run figures `training_telemetry` publishes are summed into the desk's quotes."""
    run = make_run(world)
    row = {"allocated_seconds": math.inf, "productive_seconds": 10.0, "device_hours": 1.0,
           "unplanned_interruptions_per_1000_device_hours": 0.0}
    telemetry.publish(world.ledger, run.run_id, [], [(0, n, v) for n, v in history.run_figures(row).items()])
    assert history.ALLOCATED not in {m.name for m in telemetry.metrics(world.ledger, run.run_id)}


def test_log_lines_from_undecodable_bytes_and_nul_are_stored_visibly(world) -> None:
    run = make_run(world)
    raw = b"worker said \xff\xfe then \x00 and \xc3\xa9".decode("utf-8", "surrogateescape")
    telemetry.append_log(world.ledger, run.run_id, "info\udcff", raw)
    telemetry.record_metric(world.ledger, run.run_id, 1, "loss\udcff", 1.0)
    [line] = telemetry.logs(world.ledger, run.run_id)
    assert line.message == "worker said \\udcff\\udcfe then \\x00 and \u00e9" and line.level == "info\\udcff"
    assert telemetry.metrics(world.ledger, run.run_id)[0].name == "loss\\udcff"


def test_a_credential_cut_at_the_length_bound_leaves_no_prefix(world) -> None:
    """The bound cuts a message before it is redacted; the half of a token it keeps matches no
    secret pattern, so the cut drops the word it falls in."""
    run = make_run(world)
    names = ("aws", "github", "hugging_face", "entropy", "jwt", "url")
    for name in names:
        secret = CANARIES[name]
        for keep in (6, len(secret) // 2, len(secret) - 1):  # characters of it before the cut
            start = 4000 - len(" [CUT]") - keep
            telemetry.append_log(world.ledger, run.run_id, "info", ("w " * 2000)[:start - 1] + " " + secret + " after")
    lines = telemetry.every_page(telemetry.logs, world.ledger, run.run_id)
    assert len(lines) == 3 * len(names)
    for line in lines:
        assert line.message.endswith(" [CUT]") and len(line.message) <= 4000
        for secret in (CANARIES[name] for name in names):
            assert not any(secret[i:i + 6] in line.message for i in range(len(secret) - 5))


def test_metric_names_at_the_columns_bound_are_stored_once_and_never_lose_their_batch(world) -> None:
    """128 characters, 129, an escape that lengthens a name past the column (a NUL at 127: it was
    cut first, then escaped to 131 characters, which PostgreSQL refuses, and with one transaction for
    the publication the row beside it was lost); published again, nothing is added."""
    run = make_run(world)
    names = ["a" * 128, "b" * 129, "c" * 127 + "\x00", "d" * 200]
    figures = [(1, name, 1.0) for name in names] + [(1, "pretraining/loss", 2.0)]
    assert telemetry.publish(world.ledger, run.run_id, [], figures) == (0, 5)
    stored = {m.name: m.value for m in telemetry.every_page(telemetry.metrics, world.ledger, run.run_id)}
    assert stored.keys() == {"a" * 128, "b" * 128, "c" * 127 + "\\", "d" * 128, "pretraining/loss"}
    assert all(len(name) <= 128 for name in stored)
    assert telemetry.publish(world.ledger, run.run_id, [], figures) == (0, 0)
    assert telemetry.publish(world.ledger, run.run_id, [], figures, revised=True) == (0, 0)
