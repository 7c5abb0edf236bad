"""The eval battery's configuration, apart from the battery (evaluation.py, which needs torch): the
data decision and its Dagster parameters build it where torch is not imported."""

from __future__ import annotations

from dataclasses import dataclass


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    # Four choices: ARC / MMLU / OLMES multiple-choice format.
    num_candidates: int = 4
    seed: int = 0  # which distractors each item gets
    batch_size: int = 32
    # Longest greedy continuation: the fixture answers are at most 19 words.
    max_new_tokens: int = 32

    def __post_init__(self) -> None:
        _require(self.num_candidates >= 2, "num_candidates", "must be at least 2")
        _require(self.batch_size >= 1, "batch_size", "must be positive")
        _require(self.max_new_tokens >= 1, "max_new_tokens", "must be positive")
