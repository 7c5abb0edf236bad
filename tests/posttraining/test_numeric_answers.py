"""An arithmetic answer scores only when written the one canonical way, `str(int)`: ASCII digits,
a minus sign for a negative, no "+", no leading zero, no digit separators; whitespace around it
aside, as exact_match strips it. Python's int() reads all of these, and each scored 1.0."""

from __future__ import annotations

import pytest

from ito_assets.posttraining.rewards import score
from ito_assets.posttraining.tasks import Task

TEN = Task(task_id="a", family="arithmetic", prompt="3+7=", answer="10")
MINUS_THREE = Task(task_id="b", family="arithmetic", prompt="4-7=", answer="-3")
ZERO = Task(task_id="c", family="arithmetic", prompt="3-3=", answer="0")


@pytest.mark.parametrize("task, completion", [
    (TEN, "10"), (TEN, " 10\n"), (TEN, "10\n\n"), (MINUS_THREE, "-3"), (ZERO, "0"), (ZERO, " 0 "),
])
def test_the_canonical_integer_scores(task, completion):
    assert score(task, completion) == 1.0


@pytest.mark.parametrize("task, completion", [
    (TEN, "1_0"), (TEN, "+10"), (TEN, "010"), (TEN, "0010"),
    (TEN, "\u0661\u0660"),  # Arabic-Indic
    (TEN, "\uff11\uff10"),  # fullwidth
    (TEN, "\U0001d7cf\U0001d7ce"),  # mathematical bold
    (TEN, "1\u0660"),  # an ASCII digit and an Arabic-Indic one
    (MINUS_THREE, "\u22123"),  # a Unicode minus sign
    (MINUS_THREE, "- 3"), (ZERO, "-0"), (ZERO, "+0"), (ZERO, "00"),
    (TEN, "10 10"), (TEN, "9" * 5000), (TEN, ""), (TEN, "10.0"), (TEN, "11"),
])
def test_another_spelling_of_the_integer_scores_zero(task, completion):
    assert score(task, completion) == 0.0
