"""How DPO's reference pass is cut: the pairs a forward of the frozen reference holds at a time.

Free of torch, so that the planner prices the passes the worker runs (`plan.py`) with the rule
that cuts them (`dpo.reference_logprobs`).
"""

from __future__ import annotations

# The reference's logits held at a time (float32): 256 MiB, so that a real vocabulary and context
# (128k x 2,048 positions is 1 GiB per answer) runs a pair at a time rather than out of memory. The
# values do not depend on the chunk beyond float order.
LOGITS_BUDGET_BYTES = 256 * 2**20


def reference_chunk(num_positions: int, vocab_size: int) -> int:
    """Pairs per forward pass of the reference: their two answers' float32 logits within the budget, at least one."""
    return max(1, LOGITS_BUDGET_BYTES // (2 * num_positions * vocab_size * 4))


def busiest_rank_pairs(num_pairs: int, num_positions: int, vocab_size: int, world_size: int) -> int:
    """The most pairs one rank computes when `world_size` ranks take every world_size-th pass in
    turn (rank 0 the first): whole passes, and the short last one where it falls to a busiest rank."""
    chunk = reference_chunk(num_positions, vocab_size)
    full, rest = divmod(num_pairs, chunk)  # whole passes, and the pairs of a short last one
    rounds, extra = divmod(full, world_size)  # every rank's whole passes, and ranks with one more
    if extra:
        return (rounds + 1) * chunk  # the short pass goes to a rank after those with an extra one
    return rounds * chunk + rest
