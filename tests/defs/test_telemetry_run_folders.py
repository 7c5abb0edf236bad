"""`training_telemetry` reads the stage folders of the ledger run its Dagster run is tagged with,
from the folder the server approved for that run, never the folders its stage inputs name: the IO
manager keeps one stage output per manifest partition, so a second ledger run of the same manifest
that ended later has stored its own there. Its goodput is weighed at the run's booked GPUs."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from types import SimpleNamespace  # noqa: E402

from ito_assets.control import bookings, identity, telemetry  # noqa: E402
from ito_assets.control.bookings import BookingTerms  # noqa: E402
from ito_assets.control.ledger import manifests, runs  # noqa: E402
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource  # noqa: E402
from ito_assets.defs.telemetry.assets import run_telemetry  # noqa: E402
from ito_assets.runtime.record import events  # noqa: E402
from ito_assets.runtime.record.events import Event, EventKind  # noqa: E402
from test_training_chart_metadata import _stage  # noqa: E402

RUN_ID_VALUE = "run_" + "1" * 26
DIGEST = "sha256:" + "a" * 64


def _ledger_run(ledger, checkpoint_dir) -> None:
    """A run on a 4-GPU booking whose approved folder is `checkpoint_dir`."""
    account = identity.create_account(ledger, "lab", actor=None).account_id
    terms = BookingTerms(gpu_type="H100", num_gpus=4, num_nodes=1, topology="t", region="r", network="n",
                         starts_at=1, ends_at=10_000, price_per_gpu_hour_cents=100)
    booking = bookings.create(ledger, account, terms, actor=None).booking_id
    with ledger.write() as conn:
        conn.execute(manifests.insert().values(digest=DIGEST, content=b"{}", size_bytes=2, first_seen_at=1))
        conn.execute(runs.insert().values(
            run_id=RUN_ID_VALUE, account_id=account, booking_id=booking, manifest_digest=DIGEST,
            idempotency_key="telemetry-folders-1", request_fingerprint="0" * 64, confirmation_id="cfm_x",
            state="running", cost_cents=0, checkpoint_dir=str(checkpoint_dir), created_at=1, updated_at=1))


def test_the_tagged_runs_own_folders_are_read_whatever_the_inputs_name(tmp_path, installation):
    own = tmp_path / "checkpoints" / RUN_ID_VALUE / "pretraining"  # the run's: 30 s of steps in 100 s on 1 GPU
    own.mkdir(parents=True)
    events.append(own, Event(kind=EventKind.ALLOCATION, at=1000.0, seconds=100.0, num_devices=1))
    for step in range(30):
        events.append(own, Event(kind=EventKind.STEP, at=901.0 + step, step=step, seconds=1.0), by_worker=True)
    (tmp_path / "other-run").mkdir()
    stored = _stage(tmp_path / "other-run", "pretraining")  # stored over this run's by another run of the manifest
    ledger_resource = LedgerResource.from_settings(installation.settings)
    with ledger_resource.open() as ledger:
        _ledger_run(ledger, own.parent)
    trained = {"pretraining": stored}  # `trained_stages` of the inputs the IO manager handed over
    warnings = []
    rows, metadata = run_telemetry(SimpleNamespace(warning=warnings.append),
                                   ItoSettingsResource.from_settings(installation.settings), ledger_resource, "abc123",
                                   RUN_ID_VALUE, trained)
    assert [r["stage"] for r in rows] == ["pretraining", "run"]
    assert rows[0]["productive_seconds"] == 30  # the other run's log has 60
    assert rows[-1]["goodput"] == pytest.approx(30 / (100 * 4))  # one of the 4 booked GPUs
    with ledger_resource.open() as ledger:
        published = {m.name: m.value for m in telemetry.every_page(telemetry.metrics, ledger, RUN_ID_VALUE)}
    assert published["run/productive_seconds"] == 30 and published["run/allocated_device_seconds"] == 400
    assert "step_time" not in metadata and metadata["stages"] == "pretraining"  # the other run's calibration is not this run's
    assert warnings == ["stage records of another run left out of the step-time chart: pretraining"]
