"""Fixtures of the runtime tests: one learnable token shard for the whole session."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_helpers import write_tokens


@pytest.fixture(scope="session")
def tokens(tmp_path_factory) -> tuple[Path, Path]:
    return write_tokens(tmp_path_factory.mktemp("tokens"))
