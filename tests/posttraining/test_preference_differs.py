"""A DPO pair whose chosen and rejected answers are the same (whitespace aside, as `same_prompt`
compares texts) holds no preference: the stage refuses it, naming its line, before any compute."""

from __future__ import annotations

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.fixtures import InstructionPair, PreferencePair, check_pairs
from ito_assets.posttraining.vocab import CharVocab

CODEC = CharVocab()
GOOD = PreferencePair(pair_id="good", prompt="max 123=", chosen="3", rejected="1")


def _check(pairs) -> None:
    check_pairs(pairs, CODEC, max_positions=64, batch_size=1, name="dpo_pairs.jsonl")


@pytest.mark.parametrize("chosen, rejected", [("3", "3"), ("", ""), ("3", " 3\n"), ("3 1", "3  1")])
def test_a_pair_that_prefers_an_answer_to_itself_is_refused_by_its_line(chosen, rejected):
    same = PreferencePair(pair_id="same", prompt="max 123=", chosen=chosen, rejected=rejected)
    with pytest.raises(ItoError) as refused:
        _check([GOOD, GOOD, same])
    assert refused.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    assert refused.value.message == ("dpo_pairs.jsonl: line 3 prefers an answer to itself: its chosen and "
                                     "rejected are the same, whitespace aside")


@pytest.mark.parametrize("chosen, rejected", [("3", "1"), ("3", "33"), ("3 1", "31"), ("3", "")])
def test_different_answers_are_kept(chosen, rejected):
    _check([PreferencePair(pair_id="p", prompt="max 123=", chosen=chosen, rejected=rejected)])


def test_an_instruction_pair_has_one_answer_and_no_such_rule():
    _check([InstructionPair(pair_id="p", prompt="max 123=", response="3")])
