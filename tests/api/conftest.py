"""Fixtures for the API tests: one real `ito serve` per module on a free loopback port."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from api_harness import Client, Server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    root = Path(os.path.realpath(tmp_path_factory.mktemp("serve")))
    running = Server(root)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def api(server: Server, tmp_path_factory) -> Client:
    return Client(server, Path(os.path.realpath(tmp_path_factory.mktemp("client"))))
