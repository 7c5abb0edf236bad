"""RLVR's lengths leave a right answer and its eos (2 tokens, the battery's shortest right
completion) clear of DAPO's overlong penalty: the manifest accepts exactly the (max_new_tokens,
overlong_cache) where that completion's penalty is 0. With max_new_tokens 1 a completion could only
be cut (masked out of the loss) or a bare eos, and all RLVR could learn was never to stop."""

from __future__ import annotations

import pydantic
import pytest
import torch

from ito_assets.manifest.schema import RlvrStep
from ito_assets.posttraining.losses import overlong_penalty

ANSWER_AND_EOS = 2


def _accepted(max_new_tokens: int, overlong_cache: int) -> bool:
    try:
        RlvrStep(kind="rlvr", max_new_tokens=max_new_tokens, overlong_cache=overlong_cache)
    except pydantic.ValidationError:
        return False
    return True


@pytest.mark.parametrize("max_new_tokens", range(1, 11))
def test_the_manifest_accepts_the_lengths_that_leave_an_answer_and_eos_unpenalised(max_new_tokens):
    for overlong_cache in range(1, max_new_tokens + 1):
        penalty = overlong_penalty(torch.tensor([ANSWER_AND_EOS]), max_length=max_new_tokens,
                                   cache_length=overlong_cache)
        assert _accepted(max_new_tokens, overlong_cache) is (float(penalty[0]) == 0.0), (max_new_tokens, overlong_cache)


def test_the_edges():
    assert not _accepted(1, 1) and not _accepted(2, 1)  # the reviewed "never stop" lengths
    assert _accepted(3, 1) and not _accepted(3, 2)
    assert _accepted(8, 6) and not _accepted(8, 7) and not _accepted(8, 8)
    assert _accepted(2**16, 2**16 - 2) and not _accepted(2**16, 2**16 - 1)
