"""A stage's end publishes the run's figures so far; a ledger that cannot take them is a warning
in the stage's log, never an error over the stage's own outcome, and says nothing of the error's
text (a connection error can carry the ledger's address and its password)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from ito_assets.defs.telemetry.assets import publish_after_stage
from ito_assets.runtime.record.storage import RunLayout

CANARY = "postgresql://ito:canary-secret-3f9a@db/ledger"


def test_a_ledger_that_cannot_take_the_figures_is_a_warning_without_its_text(tmp_path) -> None:
    warnings = []
    context = SimpleNamespace(log=SimpleNamespace(warning=warnings.append))

    @contextlib.contextmanager
    def refusing():
        raise ConnectionError(f"could not connect to {CANARY}")
        yield

    publish_after_stage(context, SimpleNamespace(open=refusing), "run-1", RunLayout(checkpoint_dir=tmp_path, run_dir=tmp_path))
    (warning,) = warnings
    assert "ConnectionError" in warning and "not published" in warning and CANARY not in warning and "canary" not in warning


def test_a_stage_end_publishes_through_the_ledger_it_is_given(tmp_path, monkeypatch) -> None:
    published = []
    monkeypatch.setattr("ito_assets.defs.telemetry.assets.publish_run",
                        lambda ledger, run_id, stage_dirs: published.append((ledger, run_id, dict(stage_dirs))))
    (tmp_path / "pretraining").mkdir()

    @contextlib.contextmanager
    def opened():
        yield "the ledger"

    layout = RunLayout(checkpoint_dir=tmp_path, run_dir=tmp_path)
    publish_after_stage(SimpleNamespace(log=None), SimpleNamespace(open=opened), "run-1", layout)
    assert published == [("the ledger", "run-1", {"pretraining": tmp_path / "pretraining"})]
