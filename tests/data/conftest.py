"""Paths of the committed fixtures used by the data-preparation tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ito_assets.settings import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "data" / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    if not (FIXTURES / "manifests" / "fixture-small.json").is_file():
        pytest.skip("the committed fixtures are missing (scripts/make_fixtures.py writes them)")
    return FIXTURES


@pytest.fixture
def real_tmp(tmp_path: Path) -> Path:
    # The manifest reader refuses symlinked parents; some systems link /tmp.
    return Path(os.path.realpath(tmp_path))
