"""One train / held-out split for the data decision and the training stages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ito_assets.runtime.stage import corpus
from ito_assets.training import decision
from ito_assets.training.heldout import heldout_mask, num_heldout, split_heldout


def test_the_decision_and_the_training_stages_split_with_the_one_rule():
    assert decision.split_heldout is split_heldout and corpus.heldout_mask is heldout_mask
    texts = [f"document {i}" for i in range(585)]
    mask = heldout_mask(len(texts), 0.05, 3)
    assert split_heldout(texts, 0.05, 3) == ([t for t, m in zip(texts, mask) if not m], [t for t, m in zip(texts, mask) if m])


@pytest.mark.parametrize(("num_texts", "expected"), [
    (2, 1), (19, 1), (20, 1),  # fewer than 20 documents: still one held out
    (29, 1), (30, 2), (31, 2),  # 1.45 -> 1; 1.5 -> 2 and 2.5 -> 2 (half to even); 1.55 -> 2
    (50, 2), (51, 3),
    (585, 29), (2136, 107), (2526, 126),  # the fixture corpora: pydoc topics, the two clean mixtures
])
def test_five_percent_rounds_to_the_nearest_document_and_holds_out_at_least_one(num_texts, expected):
    assert num_heldout(num_texts, 0.05) == expected


def test_no_fraction_holds_out_nothing_and_a_large_one_leaves_one_to_train_on():
    assert num_heldout(10, 0.0) == 0 and split_heldout(["a", "b"], 0.0, 0) == (["a", "b"], [])
    assert num_heldout(3, 0.9) == 2


@pytest.mark.parametrize(("num_texts", "fraction"), [(1, 0.05), (0, 0.05), (10, -0.1), (10, 1.0)])
def test_nonsense_is_refused(num_texts, fraction):
    with pytest.raises(ValueError):
        num_heldout(num_texts, fraction)


@given(num_texts=st.integers(2, 500), fraction=st.floats(0.001, 0.49), seed=st.integers(0, 2**32 - 1))
def test_a_split_is_a_seeded_partition_in_order(num_texts, fraction, seed):
    texts = [f"doc {i}" for i in range(num_texts)]
    train, heldout = split_heldout(texts, fraction, seed)
    assert split_heldout(texts, fraction, seed) == (train, heldout)
    assert len(heldout) == num_heldout(num_texts, fraction) and 1 <= len(heldout) < num_texts
    assert sorted(train + heldout, key=texts.index) == texts
    assert train == [t for t in texts if t in set(train)] and heldout == [t for t in texts if t in set(heldout)]
