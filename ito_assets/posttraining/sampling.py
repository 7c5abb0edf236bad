"""DAPO dynamic sampling (Yu et al. 2025, section 3.2): a group whose rewards are all equal has
zero advantage everywhere and teaches nothing, so it is dropped and another is drawn, until the
batch holds `num_groups` useful groups or `max_draws` groups were drawn (a bound, so that a task
the policy always or never solves cannot stall training). Too-old groups are dropped first.

Every group drawn costs a generation, so the stage's draws are bounded by what the plan prices
(`DrawBudget`): the manifest's `max_draws_per_group` for each group its steps train on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ito_assets.posttraining.rollouts import Group


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
    """Draw groups until `num_groups` are fresh and informative, or `max_draws` were drawn (fewer
    than `num_groups` allowed: a budget's last draws fill a short batch)."""
    if num_groups < 1 or max_draws < 1:
        raise ValueError("num_groups and max_draws must be >= 1")
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


@dataclass(kw_only=True)
class DrawBudget:
    """The groups a stage may draw: `max_draws_per_group` for each of the `groups_per_step` groups
    of each step, as the plan prices them. A batch draws at most one step's share; a step may also
    use what the steps before it left (a batch without signal draws again from that), never more
    than the shares up to and including its own. An attempt resumed at `first_step` counts the
    steps before it as spent: it cannot know what they drew, and they drew at most that."""

    groups_per_step: int
    max_draws_per_group: int
    first_step: int = 0
    drawn: int = 0

    def __post_init__(self) -> None:
        if self.groups_per_step < 1 or self.max_draws_per_group < 1:
            raise ValueError("groups_per_step and max_draws_per_group must be >= 1")

    @property
    def share(self) -> int:
        return self.groups_per_step * self.max_draws_per_group

    def left(self, step: int) -> int:
        """Groups the step at 0-based `step` (the optimizer steps taken before it) may still draw."""
        return max(0, (step + 1 - self.first_step) * self.share - self.drawn)

    def fill(self, step: int, draw: Callable[[], Group], is_fresh: Callable[[Group], bool]) -> FilledBatch | None:
        """A batch for the step at `step`, drawing at most one step's share or what is left if
        less; None where nothing is left."""
        bound = min(self.share, self.left(step))
        if bound == 0:
            return None
        filled = fill_batch(draw, is_fresh, num_groups=self.groups_per_step, max_draws=bound)
        self.drawn += filled.num_drawn
        return filled
