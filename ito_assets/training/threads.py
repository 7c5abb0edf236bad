"""The CPU thread count of a step that sets its own, given back when the step ends.

Float reductions depend on how many threads split them, so a count left behind by one step changes
what the next step in the same process computes (an in-process Dagster run, a test worker)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

# More intra-op threads than any host here has cores only oversubscribes them; a million was taken.
MAX_THREADS = 1024


def check_thread_count(count: int, name: str = "num_threads") -> None:
    """ValueError (naming `name`, never the value) unless 0 (leave torch's) to MAX_THREADS."""
    if not 0 <= count <= MAX_THREADS:
        raise ValueError(f"{name}: must be 0 (torch's default) to {MAX_THREADS}")


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block on `count` intra-op threads (None or 0: leave them as they are)."""
    if not count:
        yield
        return
    import torch  # paid by the step that trains, not by whoever imports this module

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
