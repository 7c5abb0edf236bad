"""How DPO's reference pass is cut: the pairs a forward of the frozen reference holds at a time.

Free of torch, so that the planner prices the passes the worker runs (`plan.py`) with the rule
that cuts them (`dpo.reference_logprobs`).
"""

from __future__ import annotations

import math

# The reference's logits held at a time (float32): 256 MiB, so that a real vocabulary and context
# (128k x 2,048 positions is 1 GiB per answer) runs a pair at a time rather than out of memory. The
# values do not depend on the chunk beyond float order.
LOGITS_BUDGET_BYTES = 256 * 2**20


def reference_chunk(num_positions: int, vocab_size: int) -> int:
    """Pairs per forward pass of the reference: their two answers' float32 logits within the budget, at least one."""
    return max(1, LOGITS_BUDGET_BYTES // (2 * num_positions * vocab_size * 4))


def passes_per_rank(num_pairs: int, num_positions: int, vocab_size: int, world_size: int) -> int:
    """The most passes one rank runs when `world_size` ranks take every world_size-th pass in turn."""
    return math.ceil(math.ceil(num_pairs / reference_chunk(num_positions, vocab_size)) / world_size)
