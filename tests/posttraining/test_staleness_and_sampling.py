"""Bounded staleness (no sample older than k is ever used) and DAPO dynamic sampling."""

from __future__ import annotations

import itertools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ito_assets.posttraining.rollouts import Group, Rollout
from ito_assets.posttraining.sampling import DrawBudget, fill_batch
from ito_assets.posttraining.staleness import StalenessFilter, staleness


def _group(version: int, rewards: tuple[float, ...], task: str = "t") -> Group:
    rollouts = tuple(
        Rollout(prompt_ids=(1,), completion_ids=(2,), behaviour_logprobs=(-0.1,), truncated=False, score=r, reward=r)
        for r in rewards
    )
    return Group(task_id=task, policy_version=version, rollouts=rollouts)


# Groups as the generator sends them: (how far behind the trainer the generating weights were,
# whether the group's rewards are mixed); and the optimizer steps the trainer takes per batch.
_groups = st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1, max_size=60)
_advances = st.lists(st.integers(1, 3), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(groups=_groups, advances=_advances, max_staleness=st.integers(0, 4), num_groups=st.integers(1, 4))
def test_no_group_older_than_k_is_ever_used(groups, advances, max_staleness, num_groups):
    staleness_filter = StalenessFilter(max_staleness=max_staleness)
    stream, version, num_drawn = iter(groups), 10, 0

    def draw() -> Group:
        nonlocal num_drawn
        lag, mixed = next(stream, (0, True))
        num_drawn += 1
        return _group(max(0, version - lag), (1.0, 0.0) if mixed else (1.0, 1.0))

    for advance in advances:
        batch = fill_batch(draw, lambda g: staleness_filter.admit(g.policy_version, version),
                           num_groups=num_groups, max_draws=num_groups * 3)
        for group in batch.groups:  # what the trainer uses for this batch's updates
            assert staleness(group.policy_version, version) <= max_staleness
            assert not group.all_equal
        version += advance  # the optimizer steps on this batch
    report = staleness_filter.report()
    assert all(lag <= max_staleness for lag in report.admitted)
    assert all(lag > max_staleness for lag in report.dropped)
    assert report.num_admitted + report.num_dropped == num_drawn


def test_staleness_counts_and_histogram():
    staleness_filter = StalenessFilter(max_staleness=1)
    decisions = [staleness_filter.admit(v, 5) for v in (5, 4, 3, 5, 1)]
    assert decisions == [True, True, False, True, False]
    report = staleness_filter.report()
    assert report.admitted == {0: 2, 1: 1} and report.dropped == {2: 1, 4: 1}
    assert report.as_dict()["num_dropped_stale"] == 2


def test_a_sample_from_the_future_is_a_bug():
    with pytest.raises(ValueError):
        staleness(6, 5)


def test_dynamic_sampling_drops_equal_groups_and_refills():
    stream = iter([_group(0, (1.0, 1.0)), _group(0, (0.0, 0.0)),
                   _group(0, (1.0, 0.0), "a"), _group(0, (0.0, 1.0), "b")])
    batch = fill_batch(lambda: next(stream), lambda g: True, num_groups=2, max_draws=10)
    assert [g.task_id for g in batch.groups] == ["a", "b"]
    assert (batch.num_drawn, batch.num_dropped_all_equal, batch.num_dropped_stale) == (4, 2, 0)
    assert not batch.exhausted


def test_dynamic_sampling_is_bounded():
    batch = fill_batch(lambda: _group(0, (1.0, 1.0)), lambda g: True, num_groups=2, max_draws=7)
    assert batch.num_drawn == 7 and batch.num_kept == 0 and batch.exhausted


def test_a_budgets_last_draws_fill_a_short_batch():
    batch = fill_batch(lambda: _group(0, (1.0, 0.0)), lambda g: True, num_groups=3, max_draws=2)
    assert batch.num_drawn == batch.num_kept == 2 and batch.exhausted
    with pytest.raises(ValueError, match="max_draws"):
        fill_batch(lambda: _group(0, (1.0, 0.0)), lambda g: True, num_groups=3, max_draws=0)


def _draws(budget: DrawBudget, step: int, equal: bool = True) -> int | None:
    """The groups a batch of `step` draws when every group is all-equal (or none is); None: nothing left."""
    filled = budget.fill(step, lambda: _group(0, (1.0, 1.0) if equal else (1.0, 0.0)), lambda g: True)
    return None if filled is None else filled.num_drawn


def test_a_step_draws_its_share_then_what_the_steps_before_it_left_and_never_more():
    budget = DrawBudget(groups_per_step=2, max_draws_per_group=3)  # a share of 6
    assert budget.share == 6 and budget.left(0) == 6
    assert _draws(budget, 0, equal=False) == 2  # step 0 filled at once: 4 of its share left
    assert budget.left(1) == 10
    assert [_draws(budget, 1), _draws(budget, 1), _draws(budget, 1)] == [6, 4, None]  # its own 6, then step 0's 4
    assert budget.drawn == 12 == 2 * budget.share and budget.left(1) == 0
    assert _draws(budget, 2) == 6 and _draws(budget, 2) is None


def test_an_attempt_resumed_at_a_step_counts_the_steps_before_it_as_spent():
    budget = DrawBudget(groups_per_step=4, max_draws_per_group=1, first_step=5)
    assert budget.left(5) == 4 and budget.left(7) == 12
    assert _draws(budget, 5) == 4 and _draws(budget, 5) is None
    with pytest.raises(ValueError, match="max_draws_per_group"):
        DrawBudget(groups_per_step=4, max_draws_per_group=0)


@settings(max_examples=200, deadline=None)
@given(groups_per_step=st.integers(1, 4), max_draws=st.integers(1, 5), num_steps=st.integers(1, 6),
       first_step=st.integers(0, 3), mixed=st.lists(st.booleans(), min_size=1, max_size=50),
       retries=st.integers(1, 4))
def test_no_attempt_draws_more_than_its_steps_priced(groups_per_step, max_draws, num_steps, first_step, mixed, retries):
    """However the groups fall and a step retries, an attempt's draws through step s stay within
    the shares of steps first_step..s, and a batch within one share."""
    budget = DrawBudget(groups_per_step=groups_per_step, max_draws_per_group=max_draws, first_step=first_step)
    stream = itertools.cycle(mixed)
    for step in range(first_step, first_step + num_steps):
        for _ in range(retries):
            filled = budget.fill(step, lambda: _group(0, (1.0, 0.0) if next(stream) else (1.0, 1.0)), lambda g: True)
            if filled is None:
                break
            assert 1 <= filled.num_drawn <= budget.share
            assert budget.drawn <= (step + 1 - first_step) * budget.share
            if filled.groups:
                break

