"""Shared fixtures; the builders live in helpers.py."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from helpers import Installation, valid_manifest, write_manifest


@pytest.fixture
def manifest_path(tmp_path: Path) -> str:
    return write_manifest(tmp_path / "manifest.json", valid_manifest())


@pytest.fixture
def installation(tmp_path: Path) -> Installation:
    return Installation(tmp_path)


@pytest.fixture
def instance():
    with dg.instance_for_test() as test_instance:
        yield test_instance
