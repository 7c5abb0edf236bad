"""One intra-op thread: the CI machine is shared, and OpenMP threads spinning against other
processes made two-thread CPU training ~6x slower there (measured: 870 vs 5,000 tokens/s)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
