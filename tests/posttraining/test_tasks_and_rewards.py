"""Verifiable tasks are deterministic; rewards are exact; code is judged by its tests, sandboxed."""

from __future__ import annotations

from ito_assets.posttraining.rewards import network_namespace_available, run_code_tests, score
from ito_assets.posttraining.tasks import (
    addition_tasks, code_tasks, exact_match_tasks, largest_digit_tasks, make_tasks, split_held_out,
)


def test_tasks_are_deterministic_and_answers_right():
    assert make_tasks("arithmetic", seed=3, count=20) == make_tasks("arithmetic", seed=3, count=20)
    assert make_tasks("arithmetic", seed=3, count=20) != make_tasks("arithmetic", seed=4, count=20)
    for task in make_tasks("arithmetic", seed=3, count=50):
        assert str(eval(task.prompt.rstrip("="))) == task.answer  # noqa: S307 - our own digits and operators
    assert [t.prompt for t in addition_tasks(max_operand=1)] == ["0+0=", "0+1=", "1+0=", "1+1="]
    assert largest_digit_tasks()[371].prompt == "max 371=" and largest_digit_tasks()[371].answer == "7"


def test_exact_match_answers():
    for task in exact_match_tasks(seed=1, count=60):
        operand = task.prompt.split(" ", 1)[1].rstrip("=")
        kind = task.prompt.split(" ", 1)[0]
        expected = {"rev": operand[::-1], "sort": "".join(sorted(operand)), "parity": str(operand.count("1") % 2)}[kind]
        assert task.answer == expected


def test_held_out_split_is_disjoint_and_seeded():
    tasks = largest_digit_tasks()
    train, held = split_held_out(tasks, held_out_fraction=0.2, seed=0)
    assert len(held) == 200 and len(train) == 800
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    assert split_held_out(tasks, held_out_fraction=0.2, seed=0) == (train, held)


def test_arithmetic_and_exact_match_rewards():
    add = addition_tasks()[34]  # 3+4=
    assert score(add, "7") == 1.0 and score(add, " 7 ") == 1.0
    assert score(add, "8") == 0.0 and score(add, "7.0") == 0.0 and score(add, "") == 0.0
    big = largest_digit_tasks()[371]
    assert score(big, "7") == 1.0 and score(big, "3") == 0.0 and score(big, "77") == 0.0


def test_code_reward_runs_the_unit_tests():
    task = code_tasks(seed=5, count=1)[0]
    assert score(task, task.answer) == 1.0
    assert score(task, "0") == 0.0
    assert score(task, "x +") == 0.0  # syntax error


def test_code_sandbox_times_out_and_has_no_network():
    looping = run_code_tests("while True:\n    pass\n", timeout=1.0)
    assert not looping.passed
    connect = "import socket\nsocket.create_connection(('127.0.0.1', 9))\n"
    assert not run_code_tests(connect).passed
    # Even with the guard undone, the network namespace (where available) has no route out.
    undo = "import importlib, socket\nimportlib.reload(socket)\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n"
    result = run_code_tests(undo)
    assert not result.passed
    assert result.network_namespace == network_namespace_available()


def test_code_sandbox_has_an_empty_environment(monkeypatch):
    monkeypatch.setenv("ITO_CANARY_SECRET", "canary")
    assert run_code_tests("import os\nassert 'ITO_CANARY_SECRET' not in os.environ\n").passed
