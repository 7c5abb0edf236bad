"""The whole flow of docs/api.md on the embedded default (what `make run` can call) with the fixture manifest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ito_assets.api.server_walkthrough import walk
from ito_assets.settings import load_settings

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests" / "fixture-small.json"


@pytest.mark.skipif(not FIXTURE.exists(), reason="data/fixtures/manifests/fixture-small.json is not generated yet")
def test_walkthrough_books_confirms_approves_trains_cancels_and_cleans(tmp_path: Path) -> None:
    settings = load_settings().with_overrides(state_dir=Path(os.path.realpath(tmp_path)) / ".ito")
    result = walk(settings, str(FIXTURE), cancel=True)
    assert result.ids["run_id"].startswith("run_")
    assert result.steps[-2].endswith("cancelled") and "booking untouched" in result.steps[-1]
    for token in (settings.state_dir / "walkthrough").glob("*.token"):
        assert token.stat().st_mode & 0o777 == 0o600
        assert token.read_text().strip() not in "\n".join(result.steps)
