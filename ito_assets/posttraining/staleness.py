"""Bounded staleness: the trainer uses a sample only when its policy is at most k versions old.

A version is the number of optimizer steps the weights had taken. Staleness of a group is the
trainer's current version minus the version that generated it; a group with staleness above
`max_staleness` is dropped and counted, never used. Every decision lands in a histogram (used and
dropped, by staleness) that the RLVR metrics report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


def staleness(policy_version: int, current_version: int) -> int:
    """current - generating version; a sample from a version the trainer has not reached is a bug."""
    if policy_version > current_version:
        raise ValueError("a sample's policy version is newer than the trainer's")
    return current_version - policy_version


@dataclass(frozen=True, kw_only=True)
class StalenessReport:
    max_staleness: int
    admitted: dict[int, int]  # staleness -> groups admitted (young enough to be used)
    dropped: dict[int, int]  # staleness -> groups dropped as too old

    @property
    def num_admitted(self) -> int:
        return sum(self.admitted.values())

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    def as_dict(self) -> dict:
        return {
            "max_staleness": self.max_staleness,
            "num_admitted": self.num_admitted,
            "num_dropped_stale": self.num_dropped,
            "admitted_by_staleness": {str(k): v for k, v in sorted(self.admitted.items())},
            "dropped_by_staleness": {str(k): v for k, v in sorted(self.dropped.items())},
        }


class StalenessFilter:
    """Admits or drops groups by staleness and counts both (a counter on the side channel)."""

    def __init__(self, *, max_staleness: int):
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.max_staleness = max_staleness
        self._admitted: Counter[int] = Counter()
        self._dropped: Counter[int] = Counter()

    def admit(self, policy_version: int, current_version: int) -> bool:
        lag = staleness(policy_version, current_version)
        fresh = lag <= self.max_staleness
        (self._admitted if fresh else self._dropped)[lag] += 1
        return fresh

    def report(self) -> StalenessReport:
        return StalenessReport(
            max_staleness=self.max_staleness, admitted=dict(self._admitted), dropped=dict(self._dropped)
        )


def step_queue_size(groups_per_step: int) -> int:
    """RLVR's queue of generated groups (`generation.GeneratorProcess`): one trainer step's groups,
    and never fewer than two. How far the generator runs ahead, so how stale its groups get."""
    return max(2, groups_per_step)


def run_ahead_groups(groups_per_step: int) -> int:
    """The groups RLVR's generator may have made past those the trainer drew when training stops:
    a full queue and the one in hand (which it finishes before it exits)."""
    return step_queue_size(groups_per_step) + 1
