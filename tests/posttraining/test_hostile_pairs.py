"""The pair files' readers on hostile files: each is read as docs/post-training.md says, or refused
with POSTTRAINING_DATA_INVALID naming the line, never read one way here and another elsewhere."""

from __future__ import annotations

import os
import threading

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.bpe import BpeCodec
from ito_assets.posttraining.fixtures import (
    InstructionPair, PreferencePair, check_pairs, read_instruction_pairs, read_preference_pairs,
)
from ito_assets.training.tokenizer import END_OF_TEXT, TokenizerConfig, train_tokenizer

GOOD = b'{"pair_id": "a", "prompt": "1+1=", "response": "2"}'


def _refusal(read, path) -> str:
    with pytest.raises(ItoError) as caught:
        read(path)
    assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    return str(caught.value)


def test_a_repeated_key_is_refused(tmp_path):
    sft = tmp_path / "sft.jsonl"
    sft.write_bytes(GOOD + b'\n{"pair_id": "b", "prompt": "1+1=", "response": "2", "response": "3"}\n')
    message = _refusal(read_instruction_pairs, sft)
    assert "line 2 repeats a key" in message and '"3"' not in message
    dpo = tmp_path / "dpo.jsonl"
    dpo.write_bytes(b'{"pair_id": "a", "prompt": "p", "chosen": "1", "rejected": "2", "chosen": "2"}\n')
    assert "line 1 repeats a key" in _refusal(read_preference_pairs, dpo)


def test_crlf_a_last_line_without_newline_and_u2028_read_as_documented(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_bytes(GOOD + b"\r\n" + '{"pair_id": "b", "prompt": "x\u2028y", "response": "2"}'.encode())
    assert read_instruction_pairs(path) == [
        InstructionPair(pair_id="a", prompt="1+1=", response="2"),
        InstructionPair(pair_id="b", prompt="x\u2028y", response="2"),
    ]


@pytest.mark.parametrize(("data", "line"), [
    (b"\xef\xbb\xbf" + GOOD + b"\n", 1),  # a byte-order mark
    (GOOD + b"\n\n" + GOOD + b"\n", 2),  # an empty line
    (GOOD + b"\n\n", 2),  # an empty last line
    (b'{"pair_id": NaN, "prompt": "1+1=", "response": "2"}\n', 1),
])
def test_what_is_not_one_pair_a_line_is_refused_by_line(tmp_path, data, line):
    path = tmp_path / "sft.jsonl"
    path.write_bytes(data)
    assert f"line {line} " in _refusal(read_instruction_pairs, path)


def test_a_directory_is_refused(tmp_path):
    assert "is not a regular file" in _refusal(read_instruction_pairs, tmp_path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "sft.jsonl"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_instruction_pairs(fifo)
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():  # let the blocked reader go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5)
        pytest.fail("reading a FIFO waited for a writer")
    assert isinstance(outcome[0], ItoError) and "is not a regular file" in str(outcome[0])


@pytest.fixture(scope="module")
def bpe():
    tokenizer = train_tokenizer(["max 371=7 1+1=2 hello"] * 20, TokenizerConfig(vocab_size=300))
    return BpeCodec(tokenizer_json=tokenizer.to_str())


@pytest.mark.parametrize("pair", [
    InstructionPair(pair_id="a", prompt="max 371=", response=f"7{END_OF_TEXT}8"),
    InstructionPair(pair_id="a", prompt=f"hello{END_OF_TEXT}max 371=", response="7"),
    PreferencePair(pair_id="a", prompt="max 371=", chosen="7", rejected=f"{END_OF_TEXT}"),
])
def test_the_text_of_the_end_of_text_token_is_refused_in_a_pair(bpe, pair):
    assert bpe.encode(END_OF_TEXT) == [bpe.eos_id]  # what the pair's text would have become
    with pytest.raises(ItoError) as caught:
        check_pairs([pair], bpe, max_positions=64, batch_size=1, name="pairs.jsonl")
    assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    assert str(caught.value).endswith("pairs.jsonl: line 1 holds the text of a special token")
    check_pairs([InstructionPair(pair_id="a", prompt="max 371=", response="<|7|>")], bpe, max_positions=64,
                batch_size=1, name="pairs.jsonl")
