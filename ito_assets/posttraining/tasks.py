"""Verifiable tasks that can be shipped: generated from a seed, checked without a judge model.

Three families, each answerable by exact comparison or by running code:
- arithmetic: "a+b=", "a-b=", "a*b=" with an exact integer answer;
- exact_match: string transformations with one right answer (reverse, sort digits, parity bit);
- code: complete a one-line Python function body; checked by running its unit tests (rewards.py).

The same (family, seed, count) always gives the same tasks, in the same order, on any machine.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Literal, Sequence

Family = Literal["arithmetic", "exact_match", "code"]
FAMILIES: tuple[str, ...] = ("arithmetic", "exact_match", "code")


@dataclass(frozen=True, kw_only=True)
class Task:
    task_id: str
    family: Family
    prompt: str
    answer: str  # the reference answer (for code: a reference body that passes the tests)
    tests: str = ""  # code only: assert statements run after prompt + completion, over its names


def addition_tasks(*, max_operand: int = 9) -> list[Task]:
    """Every "a+b=" with 0 <= a, b <= max_operand, in order: the tiny runs' task."""
    return [
        Task(task_id=f"add/{a}+{b}", family="arithmetic", prompt=f"{a}+{b}=", answer=str(a + b))
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]


def largest_digit_tasks(*, num_digits: int = 3) -> list[Task]:
    """Every "max d1d2d3=" -> the largest digit, in order: the tiny runs' task. A skill (compare
    and copy) rather than a table of facts, so that learning on some prompts carries to held-out
    ones; a uniform guess among the prompt's digits is right about half the time, which gives
    GRPO groups with mixed rewards from the first step."""
    digits = [str(d) for d in range(10)]
    strings = [""]
    for _ in range(num_digits):
        strings = [s + d for s in strings for d in digits]
    return [Task(task_id=f"max/{s}", family="exact_match", prompt=f"max {s}=", answer=max(s)) for s in strings]


def arithmetic_tasks(*, seed: int, count: int, max_operand: int = 99) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice("+-*")
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        task_id = f"arith/{seed}/{index}"
        tasks.append(Task(task_id=task_id, family="arithmetic", prompt=f"{a}{op}{b}=", answer=str(value)))
    return tasks


def _exact_match(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(("rev", "sort", "parity"))
    if kind == "parity":
        bits = "".join(rng.choice("01") for _ in range(rng.randint(3, 8)))
        return f"parity {bits}=", str(bits.count("1") % 2)
    word = "".join(rng.choice("abcdefghij0123456789") for _ in range(rng.randint(3, 6)))
    if kind == "rev":
        return f"rev {word}=", word[::-1]
    return f"sort {word}=", "".join(sorted(word))


def exact_match_tasks(*, seed: int, count: int) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        prompt, answer = _exact_match(rng)
        tasks.append(Task(task_id=f"exact/{seed}/{index}", family="exact_match", prompt=prompt, answer=answer))
    return tasks


# (description, reference body over x and k): one-line functions a small model can complete.
_CODE_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("return x plus {k}", "x + {k}"),
    ("return x times {k}", "x * {k}"),
    ("return x modulo {k}", "x % {k}"),
    ("return the larger of x and {k}", "max(x, {k})"),
    ("return x squared minus {k}", "x * x - {k}"),
    ("return True when x is divisible by {k}", "x % {k} == 0"),
)
_CODE_INPUTS = (-3, 0, 1, 2, 7, 10)


def code_tasks(*, seed: int, count: int) -> list[Task]:
    """`def f(x):` one-liners; tests compare with the reference on fixed inputs."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        description, body = rng.choice(_CODE_TEMPLATES)
        k = rng.randint(2, 9)
        reference = body.format(k=k)
        expected = [(x, eval(reference, {}, {"x": x})) for x in _CODE_INPUTS]  # noqa: S307 - our own template
        # A built-in number first: a value of the program's own class could say yes to any `==`.
        tests = "\n".join(
            f"assert type(got := f({x})) in (bool, int, float) and got == {value!r}" for x, value in expected
        )
        prompt = f"# {description.format(k=k)}\ndef f(x):\n    return "
        tasks.append(Task(task_id=f"code/{seed}/{index}", family="code", prompt=prompt, answer=reference, tests=tests))
    return tasks


def make_tasks(family: str, *, seed: int, count: int) -> list[Task]:
    if family == "arithmetic":
        return arithmetic_tasks(seed=seed, count=count)
    if family == "exact_match":
        return exact_match_tasks(seed=seed, count=count)
    if family == "code":
        return code_tasks(seed=seed, count=count)
    raise ValueError(f"family must be one of {FAMILIES}")


def held_out_count(num_tasks: int, held_out_fraction: float) -> int:
    """How many of `num_tasks` prompts `split_held_out` holds out: at least two, the fewest a
    stage's paired eval gate can compare (its standard error needs two differences)."""
    return max(2, round(held_out_fraction * num_tasks))


def split_held_out(tasks: Sequence[Task], *, held_out_fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """A seeded split into (train, held_out); held-out prompts are never trained on."""
    if not 0 < held_out_fraction < 1:
        raise ValueError("held_out_fraction must be in (0, 1)")
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    num_held_out = held_out_count(len(tasks), held_out_fraction)
    held = set(order[:num_held_out])
    return [t for i, t in enumerate(tasks) if i not in held], [t for i, t in enumerate(tasks) if i in held]


# The battery's train / held-out split is fixed (not the run's seed): the committed fixtures are
# built from its train side, so another split would leak held-out prompts into training.
BATTERY_SPLIT_SEED = 0


def battery_split(held_out_fraction: float) -> tuple[list[Task], list[Task]]:
    """(train, held-out) of the largest-digit battery at `held_out_fraction`, one seed for every run."""
    return split_held_out(largest_digit_tasks(), held_out_fraction=held_out_fraction, seed=BATTERY_SPLIT_SEED)


@functools.cache
def held_out_prompts(held_out_fraction: float) -> frozenset[str]:
    """The held-out side's prompts, as `same_prompt` compares them."""
    return frozenset(same_prompt(task.prompt) for task in battery_split(held_out_fraction)[1])


def same_prompt(prompt: str) -> str:
    """A prompt as the held-out check compares it: its whitespace runs as one space, none at its ends."""
    return " ".join(prompt.split())


def prefers_itself(chosen: str, rejected: str) -> bool:
    """A preference pair whose chosen and rejected answers are the same, whitespace aside (as
    `same_prompt` compares texts; the rewards strip it too), teaches no preference: its DPO margin
    is zero whatever the weights, so it trains only as its RPO term's SFT on the chosen answer,
    while counted as a preference in the batch and its accuracy."""
    return same_prompt(chosen) == same_prompt(rejected)


def self_preference_refusal(where: str) -> str:
    """The refusal of such a pair, alike at gate 5 and at the stage."""
    return f"{where} prefers an answer to itself: its chosen and rejected are the same, whitespace aside"


def _trie_pattern(words: frozenset[str]) -> str:
    """One regular expression matching any of `words`, as a trie: at each character the engine
    tries only the branches that start with it (a flat alternation of the battery's 200 held-out
    prompts tries all 200 after every "max ": 20x slower on 16 MB of them, measured)."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here

    def emit(node: dict) -> str:
        if "" in node:  # a text holding a longer word holds this one too
            return ""
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items())]
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    return emit(trie)


@functools.cache
def _held_out_pattern(held_out_fraction: float) -> re.Pattern[str]:
    return re.compile(_trie_pattern(held_out_prompts(held_out_fraction)))


def trains_held_out(prompt: str, answers: Sequence[str], held_out_fraction: float) -> bool:
    """Whether a pair would train on a held-out prompt: whether any of its rows, the prompt followed
    by an answer (as `same_prompt` compares them), holds one anywhere. A row is the tokens of the
    whole text, so "max 006" with the answer "=6" trains the very row of "max 006=" with "6", and a
    held-out prompt and its answer inside a longer prompt or an answer is trained on too. One
    search of one expression over each row's text, trying at each character only the trie's path
    (the held-out prompts are 8 characters): linear in the pairs' bytes."""
    pattern = _held_out_pattern(held_out_fraction)
    return any(pattern.search(same_prompt(prompt + answer)) for answer in answers)


def held_out_refusal(uri: str, pair_number: int, held_out_fraction: float) -> str:
    return (f"{uri}: pair {pair_number} trains on a prompt the eval battery holds out (held_out_fraction "
            f"{held_out_fraction}): the stage's eval gate would measure what it was trained on")
