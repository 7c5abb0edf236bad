"""A step that sets its own thread count gives the caller's back, even when it fails."""

import pytest
import torch

from ito_assets.training.threads import torch_threads


def test_the_callers_thread_count_comes_back() -> None:
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(other):
        raise RuntimeError("the step failed")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("count", [None, 0])
def test_no_count_leaves_the_threads_alone(count) -> None:
    before = torch.get_num_threads()
    with torch_threads(count):
        assert torch.get_num_threads() == before
