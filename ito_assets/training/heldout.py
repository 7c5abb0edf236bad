"""The one train / held-out split of a corpus, shared by the data decision
(`training.decision`) and the training stages (`runtime.corpus`, whose held-out set the stage gates
evaluate on): the same texts, fraction and seed hold out the same documents in both.

A seeded permutation; the held-out count is `fraction` of the documents rounded to the nearest
(half to even, Python's `round`), at least one while `fraction` is above zero, and never every
document: the tokenizer and the model need something to train on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# The seed of the one split. The training stages split with it (`runtime.stage.corpus`, seed 0);
# the decision must too, whatever seeds its proxies train with, or its held-out documents differ.
SPLIT_SEED = 0


def num_heldout(num_texts: int, fraction: float) -> int:
    if num_texts < 2:
        raise ValueError("texts must hold at least two documents")
    if not 0 <= fraction < 1:
        raise ValueError("fraction must be in [0, 1)")
    if fraction == 0:
        return 0
    return min(num_texts - 1, max(1, round(num_texts * fraction)))


def heldout_mask(num_texts: int, fraction: float, seed: int) -> np.ndarray:
    """True at the held-out documents' positions: one byte per document, so that a corpus read in
    batches is split without holding its texts."""
    mask = np.zeros(num_texts, dtype=bool)
    mask[np.random.default_rng(seed).permutation(num_texts)[: num_heldout(num_texts, fraction)]] = True
    return mask


def split_heldout(texts: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, held out), each in the texts' order."""
    mask = heldout_mask(len(texts), fraction, seed)
    return [t for t, held in zip(texts, mask) if not held], [t for t, held in zip(texts, mask) if held]
