"""One intra-op thread for the tiny models: measured ~8x less CPU than two threads for the
end-to-end run when the machine is shared (thread oversubscription), and no slower alone."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
