"""Fixtures for the core gate tests; the builders live in gate_world.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_world import Clock, World, make_ledger, make_policy, make_world
from ito_assets.control.policy import ServerPolicy


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request, tmp_path: Path, clock: Clock):
    ledger, close = make_ledger(request.param, tmp_path, clock)
    yield ledger
    close()


@pytest.fixture
def policy(tmp_path: Path) -> ServerPolicy:
    return make_policy(tmp_path)


@pytest.fixture
def world(ledger, policy: ServerPolicy, clock: Clock) -> World:
    return make_world(ledger, policy, clock)
