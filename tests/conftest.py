"""Shared fixtures; the builders live in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

# One OpenMP thread per process, set before torch is imported here or in any worker the tests launch:
# the xdist workers already fill both cores, and torch's default of a thread per core made every
# single-rank stage worker spin against the other tests (measured in docs/testing.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")

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


def pytest_addoption(parser) -> None:
    parser.addoption("--run-long", action="store_true", default=False,
                     help="also run the long matrices (`make test-long`)")


def pytest_configure(config) -> None:
    # Read by helpers.examples(): the property tests draw many more examples under test-long.
    if config.getoption("--run-long"):
        os.environ["ITO_TEST_LONG"] = "1"


def _longest_first(item) -> tuple[bool, float]:
    """Slow tests first, the longest declared timeout first among them: under pytest-xdist the
    whole of `make run` (test_local_run) starts at once and overlaps the thousands of short tests
    instead of running alone at the end. The sort is stable, so file order holds otherwise."""
    if item.get_closest_marker("slow") is None:
        return True, 0.0
    timeout = item.get_closest_marker("timeout")
    return False, -float(timeout.args[0] if timeout and timeout.args else item.config.getini("timeout") or 0)


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=_longest_first)
    if config.getoption("--run-long"):
        return
    skip = pytest.mark.skip(reason="a long matrix: `make test-long` runs it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
