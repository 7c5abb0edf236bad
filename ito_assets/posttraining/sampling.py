"""DAPO dynamic sampling (Yu et al. 2025, section 3.2): a group whose rewards are all equal has
zero advantage everywhere and teaches nothing, so it is dropped and another is drawn, until the
batch holds `num_groups` useful groups or `max_draws` groups were drawn (a bound, so that a task
the policy always or never solves cannot stall training). Too-old groups are dropped first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ito_assets.posttraining.rollouts import Group

# 10 draws per needed group: the bound of the DAPO recipe in verl (`max_num_gen_batches: 10`,
# generation rounds per training batch before giving up).
MAX_DRAWS_PER_GROUP = 10


@dataclass(frozen=True, kw_only=True)
class FilledBatch:
    groups: tuple[Group, ...]
    num_wanted: int
    num_drawn: int
    num_dropped_stale: int
    num_dropped_all_equal: int

    @property
    def num_kept(self) -> int:
        return len(self.groups)

    @property
    def exhausted(self) -> bool:
        """The draw bound was hit before the batch was full."""
        return self.num_kept < self.num_wanted


def fill_batch(
    draw: Callable[[], Group],
    is_fresh: Callable[[Group], bool],
    *,
    num_groups: int,
    max_draws: int,
) -> FilledBatch:
    """Draw groups until `num_groups` are fresh and informative, or `max_draws` were drawn."""
    if num_groups < 1 or max_draws < num_groups:
        raise ValueError("num_groups must be >= 1 and max_draws >= num_groups")
    kept: list[Group] = []
    num_drawn = num_stale = num_equal = 0
    while len(kept) < num_groups and num_drawn < max_draws:
        group = draw()
        num_drawn += 1
        if not is_fresh(group):
            num_stale += 1
        elif group.all_equal:
            num_equal += 1
        else:
            kept.append(group)
    return FilledBatch(
        groups=tuple(kept), num_wanted=num_groups, num_drawn=num_drawn,
        num_dropped_stale=num_stale, num_dropped_all_equal=num_equal,
    )
