"""The code reward's harness calls nothing after the program that the program could rebind: a
program that replaces exec, compile, os._exit or the trace hook in their modules scores 0.0 when
its answer is wrong, and its right answer still scores 1.0."""

from __future__ import annotations

import pytest

from ito_assets.posttraining.rewards import score
from ito_assets.posttraining.tasks import code_tasks

TASK = code_tasks(seed=0, count=1)[0]  # def f(x): return max(x, 8); its last test is f(10) == 10

# Right on the last test's input only: it passes only if the first five asserts never run.
LAST_ONLY = "x if x == 10 else 0"

# A trace function that jumps from the tests' first line to their last, kept alive by making the
# harness's `sys.settrace(None)` a no-op.
JUMP_OVER_ASSERTS = """
import sys
def _local(frame, event, arg):
    if event == "line" and frame.f_code.co_filename == "tests.py" and frame.f_lineno == 1:
        frame.f_lineno = 6
    return _local
_set = sys.settrace
sys.settrace = lambda function: None
_set(lambda frame, event, arg: _local if frame.f_code.co_filename == "tests.py" else None)
"""

REBINDS = {
    "exec": "import builtins; builtins.exec = lambda *args, **kwargs: None",  # the tests never run
    "os._exit": "import os; os._exit = lambda code: None",  # a failed assert falls through to the proof
    "compile": "import builtins; _c = builtins.compile; builtins.compile = lambda *a, **k: _c('pass', 't', 'exec')",
    "settrace": JUMP_OVER_ASSERTS,
}


@pytest.mark.parametrize("name", sorted(REBINDS))
def test_a_program_that_rebinds_what_the_harness_calls_next_scores_zero(name):
    assert TASK.tests.count("\n") == 5 and "f(10)" in TASK.tests.splitlines()[-1]
    assert score(TASK, f"{LAST_ONLY}\n{REBINDS[name]}") == 0.0
    assert score(TASK, f"12345\n{REBINDS[name]}") == 0.0
    assert score(TASK, f"{TASK.answer}\n{REBINDS[name]}") == 1.0  # the harness itself still works
