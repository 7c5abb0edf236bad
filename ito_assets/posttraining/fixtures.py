"""Instruction pairs (SFT) and preference pairs (DPO): the records, their JSONL files, and the
deterministic generator behind `scripts/make_posttraining_fixtures.py`, and the reading of the
files a manifest's recipe binds by digest.

The pairs are built from the verifiable tasks (tasks.py) so that the three stages pull the same
way: SFT teaches the answer format on the train prompts, DPO prefers the right answer over a
plausible wrong one, RLVR then optimises the verifiable reward itself. Held-out prompts (the
eval battery's) never appear in any pair.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from ito_assets.data.uris import resolve_uri
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, SftStep
from ito_assets.posttraining.tasks import Task, prefers_itself, self_preference_refusal
from ito_assets.posttraining.vocab import TextCodec


@dataclass(frozen=True, kw_only=True)
class InstructionPair:
    pair_id: str
    prompt: str
    response: str


@dataclass(frozen=True, kw_only=True)
class PreferencePair:
    pair_id: str
    prompt: str
    chosen: str
    rejected: str


def _wrong_answer(task: Task, rng: random.Random) -> str:
    """A near miss, never the right answer: a number off by 1-3; for other tasks another
    character of the prompt's operand (for "max 371=": 3 or 1)."""
    if task.family == "arithmetic":
        return str(int(task.answer) + rng.choice((-3, -2, -1, 1, 2, 3)))
    operand = task.prompt.split(" ", 1)[-1].rstrip("=")
    others = sorted(set(operand) - set(task.answer)) or sorted(set("0123456789") - set(task.answer))
    return rng.choice(others)


def instruction_pairs(tasks: Sequence[Task], *, copies: int, seed: int, error_rate: float) -> list[InstructionPair]:
    """Each task `copies` times in a seeded order; a share `error_rate` of responses are wrong,
    as in real instruction data, which leaves DPO and RLVR something to fix."""
    rng = random.Random(seed)
    pairs = []
    for copy in range(copies):
        for task in tasks:
            response = _wrong_answer(task, rng) if rng.random() < error_rate else task.answer
            pairs.append(InstructionPair(pair_id=f"sft/{task.task_id}/{copy}", prompt=task.prompt, response=response))
    rng.shuffle(pairs)
    return pairs


def preference_pairs(tasks: Sequence[Task], *, copies: int, seed: int) -> list[PreferencePair]:
    rng = random.Random(seed)
    pairs = [
        PreferencePair(pair_id=f"dpo/{t.task_id}/{c}", prompt=t.prompt, chosen=t.answer, rejected=_wrong_answer(t, rng))
        for c in range(copies)
        for t in tasks
    ]
    rng.shuffle(pairs)
    return pairs


def write_jsonl(path: Path, records: Sequence[InstructionPair | PreferencePair]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(asdict(r), sort_keys=True, ensure_ascii=True) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _lines(data: bytes, name: str) -> list[str]:
    """The file's lines, split on "\\n" alone (a JSON string may hold a raw U+2028 or U+2029, where
    `str.splitlines` would cut); a last newline ends the last line, it starts none."""
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{name} is not UTF-8") from None
    return lines[:-1] if lines[-1] == "" else lines


class _RepeatedKey(Exception):
    pass


def _object(items: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all distinct: with a repeated key, readers disagree on which
    value counts (Python's keeps the last, others the first), so the pair reviewed might not be the
    pair trained on."""
    row = dict(items)
    if len(row) != len(items):
        raise _RepeatedKey
    return row


def _row(line: str, number: int, name: str, fields: tuple[str, ...]) -> dict:
    """One line as an object of exactly `fields`, each a string that encodes as UTF-8."""
    where = f"{name}: line {number}"
    try:
        row = json.loads(line, object_pairs_hook=_object)
    # ValueError: JSONDecodeError and an integer of more than 4,300 digits; RecursionError: nesting.
    except (ValueError, RecursionError):
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{where} is not JSON") from None
    except _RepeatedKey:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{where} repeats a key") from None
    if not isinstance(row, dict) or sorted(row) != sorted(fields) or not all(isinstance(row[f], str) for f in fields):
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{where} is not an object of {', '.join(fields)}")
    try:  # a "\\ud800" escape decodes to a lone surrogate, which no tokenizer can encode
        for f in fields:
            row[f].encode("utf-8")
    except UnicodeEncodeError:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{where} holds a lone surrogate") from None
    return row


def _parse(data: bytes, name: str, kind: type, fields: tuple[str, ...]) -> list:
    records = [kind(**_row(line, number, name, fields)) for number, line in enumerate(_lines(data, name), 1)]
    if not records:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{name} holds no pairs")
    return records


_INSTRUCTION_FIELDS = ("pair_id", "prompt", "response")
_PREFERENCE_FIELDS = ("pair_id", "prompt", "chosen", "rejected")


def _read(path: Path, kind: type, fields: tuple[str, ...]) -> list:
    try:
        # Non-blocking: opening a FIFO that no one writes would wait forever; a regular file ignores it.
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{path.name} is missing") from None
    except OSError:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{path.name} cannot be read") from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{path.name} is not a regular file")
    with open(handle, "rb") as file:
        try:
            data = file.read()
        except OSError:
            raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{path.name} cannot be read") from None
    return _parse(data, path.name, kind, fields)


def read_instruction_pairs(path: Path) -> list[InstructionPair]:
    return _read(path, InstructionPair, _INSTRUCTION_FIELDS)


def read_preference_pairs(path: Path) -> list[PreferencePair]:
    return _read(path, PreferencePair, _PREFERENCE_FIELDS)


def pair_answers(pair: InstructionPair | PreferencePair) -> tuple[str, ...]:
    """What follows the prompt in the pair's rows: its response, or its chosen and rejected answers."""
    return (pair.response,) if isinstance(pair, InstructionPair) else (pair.chosen, pair.rejected)


def _encoded(codec: TextCodec, text: str, where: str) -> list[int]:
    try:
        ids = codec.encode(text)
    except ValueError:  # the character vocabulary's refusal
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{where} has a character outside the vocabulary") from None
    # The BPE encodes the text "<|endoftext|>" as its one special token, which is also bos, eos and
    # pad here: inside a response it would teach the model to stop and go on, inside a prompt it
    # would start a new document.
    if {codec.bos_id, codec.eos_id, codec.pad_id}.intersection(ids):
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{where} holds the text of a special token")
    return ids


def check_pairs(pairs: Sequence[InstructionPair | PreferencePair], codec: TextCodec, *, max_positions: int,
                batch_size: int, name: str) -> None:
    """What the stage's rows need of the pairs, checked before any compute is spent (else the
    worker fails its first step, three restarts later): a preference between two different answers,
    every text in the codec's vocabulary and free of its special tokens,
    bos + prompt + each answer within the model's `max_positions` (refused, never cut: a truncated
    response teaches the model to stop early), and at least one full batch."""
    for number, pair in enumerate(pairs, 1):
        where = f"{name}: line {number}"
        _require_two_answers(pair, where)
        prompt = len(_encoded(codec, pair.prompt, where))
        longest = max(1 + prompt + len(_encoded(codec, answer, where)) for answer in pair_answers(pair))
        if longest > max_positions:
            raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                           f"{where} needs {longest} positions; the model holds {max_positions}")
    if len(pairs) < batch_size:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                       f"{name} holds {len(pairs)} pairs, fewer than one batch of {batch_size}")


def _require_two_answers(pair: InstructionPair | PreferencePair, where: str) -> None:
    """A preference between two different answers (`tasks.prefers_itself`)."""
    if isinstance(pair, PreferencePair) and prefers_itself(pair.chosen, pair.rejected):
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, self_preference_refusal(where))


def check_completions(prompt_length: int, max_new_tokens: int, *, max_positions: int,
                      name: str = "the rlvr step", field: str = "max_new_tokens") -> None:
    """Sampled rows, checked before any compute as `check_pairs` checks the pairs': the longest
    prompt (`prompt_length` tokens, bos included) and a completion of `max_new_tokens` within the
    model's `max_positions`. A row's last token (eos or not) is only a target, so it takes
    prompt_length + max_new_tokens - 1 positions. Refused, never cut or stretched: in process
    generation would fail mid-stage once a completion ran that long, and the worker would give its
    model positions pretraining never trained (it sizes the rotary tables to the rows). `name` and
    `field`: whose completions (RLVR's recipe step, or the evaluation battery) and the manifest
    field that sets their length, as the refusal names them."""
    needed = prompt_length + max_new_tokens - 1
    if needed > max_positions:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                       f"{name}'s completions of up to {max_new_tokens} tokens ({field}) after its "
                       f"longest prompt of {prompt_length} need {needed} positions; the model holds {max_positions}")


def _bound(step: SftStep | DpoStep):
    """(the step's reference, its pair type, the type's fields): PROVENANCE_MISSING for an unbound
    step, POSTTRAINING_DATA_INVALID for a file that is not JSONL."""
    if step.data is None:
        raise ItoError(ErrorCode.PROVENANCE_MISSING, f"the {step.kind} step names no data file with its sha256")
    if step.data.format != "jsonl":
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"the {step.kind} pairs must be JSONL")
    if isinstance(step, SftStep):
        return step.data, InstructionPair, _INSTRUCTION_FIELDS
    return step.data, PreferencePair, _PREFERENCE_FIELDS


# The longest line the streaming reader holds: a pair the largest model the planner knows (8,192
# positions) could train on is far shorter, even at 100 bytes a token and 6-byte JSON escapes
# (4.9 MB); a longer line could never pass the stage's own length check.
MAX_STREAMED_LINE_BYTES = 16 * 2**20


def _open_regular(path: Path, uri: str, allowed: Callable[[Path], bool] | None) -> int:
    """A descriptor of the regular file at `path` (non-blocking: a FIFO put in its place is refused,
    never waited on); with `allowed`, only if the file opened is the one `path` resolves to inside
    it (a link swapped after the caller's check is DATA_POLICY_VIOLATION, not read)."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"data reference {uri} does not exist") from None
    except OSError:  # EACCES, ELOOP: the stage could not read it either
        raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"data reference {uri} cannot be read") from None
    opened = os.fstat(handle)
    if allowed is not None:
        real = os.path.realpath(path)
        try:
            same = os.stat(real)
        except OSError:
            same = None
        if same is None or (same.st_dev, same.st_ino) != (opened.st_dev, opened.st_ino) or not allowed(Path(real)):
            os.close(handle)
            raise ItoError(ErrorCode.DATA_POLICY_VIOLATION, f"data reference {uri} lies outside the allowed data roots")
    if not stat.S_ISREG(opened.st_mode):  # the stage's `is_file()`: a FIFO, a folder
        os.close(handle)
        raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"data reference {uri} does not exist")
    return handle


# A file's identity: device, inode, size, modification and change times. Any write, truncation or
# rename over it, or a `touch` that sets its modification time back, moves its change time, which
# no caller can set: while the identity holds, so do the bytes last read under it.
FileIdentity = tuple[int, int, int, int, int]
# Unless the times are too coarse to tell: ext4 and xfs before Linux 6.13 stamp them once a clock
# tick, FAT and some NFS servers every 1-2 s, so a same-size rewrite soon after a read can keep the
# identity. An identity whose change time is this recent when its read ends is no promise (git's
# rule for its "racily clean" index entries).
RACY_NS = 2_000_000_000


def file_identity(status: os.stat_result) -> FileIdentity:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def stream_bound_pairs(step: SftStep | DpoStep, data_root: Path,
                       visit: Callable[[InstructionPair | PreferencePair], None], *,
                       allowed: Callable[[Path], bool] | None = None,
                       known: Callable[[FileIdentity], bool] | None = None) -> FileIdentity | None:
    """Each pair of the file the step binds, handed to `visit` as it is read, a line at a time, the
    file hashed on the way: for a reader that needs only what the pairs add up to (gate 5's plan,
    in a server that must not hold a tenant's whole file per request). The answers are
    `read_bound_pairs`' in its order: SOURCE_NOT_FOUND (a file that cannot be read too);
    SOURCE_DIGEST_MISMATCH over the whole file; bytes that are not UTF-8 anywhere; then the first
    line that is not a pair; no pairs. One more, the reader's own: a line longer than
    MAX_STREAMED_LINE_BYTES is POSTTRAINING_DATA_INVALID. `visit` may have seen pairs of a file
    that is then refused. `known`: given the opened file's identity, True where the caller holds
    what these very bytes add up to (read and verified before under it): nothing is read. Returns
    the identity of the bytes read and verified; None where nothing was read, the file changed
    while it was read, or it changed too recently for its identity to tell (RACY_NS)."""
    ref, kind, fields = _bound(step)
    handle = _open_regular(resolve_uri(ref.uri, data_root), ref.uri, allowed)
    before = file_identity(os.fstat(handle))
    if known is not None and known(before):
        os.close(handle)
        return None
    digest, not_utf8, not_pair, count = hashlib.sha256(), False, None, 0
    with open(handle, "rb") as file:
        for number, raw in enumerate(_lines_of(file, ref.uri), 1):
            digest.update(raw)
            try:
                text = raw.removesuffix(b"\n").decode("utf-8")
            except UnicodeDecodeError:
                not_utf8 = True
                continue
            if not_pair is None and not not_utf8:
                try:
                    visit(kind(**_row(text, number, ref.uri, fields)))
                    count += 1
                except ItoError as refusal:
                    not_pair = refusal
        after = file_identity(os.fstat(file.fileno()))
    if not hmac.compare_digest(digest.hexdigest(), ref.sha256):
        raise ItoError(ErrorCode.SOURCE_DIGEST_MISMATCH, f"data reference {ref.uri} does not hash to the manifest's sha256")
    if not_utf8:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{ref.uri} is not UTF-8")
    if not_pair is not None:
        raise not_pair
    if count == 0:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, f"{ref.uri} holds no pairs")
    return before if after == before and time.time_ns() - after[4] >= RACY_NS else None


def _lines_of(file, uri: str):
    """The file's lines, each with its newline, none longer than MAX_STREAMED_LINE_BYTES; an
    OSError while reading (EIO) is the file that cannot be read."""
    number = 0
    while True:
        try:
            raw = file.readline(MAX_STREAMED_LINE_BYTES + 1)
        except OSError:
            raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"data reference {uri} cannot be read") from None
        if not raw:
            return
        number += 1
        if len(raw) > MAX_STREAMED_LINE_BYTES:
            raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                           f"{uri}: line {number} is longer than {MAX_STREAMED_LINE_BYTES:,} bytes: no model holds such a pair")
        yield raw


def read_bound_pairs(step: SftStep | DpoStep, data_root: Path) -> list[InstructionPair] | list[PreferencePair]:
    """The pairs of the file the manifest's recipe step binds by uri and sha256: the bytes are read
    once, checked against the digest (SOURCE_NOT_FOUND, SOURCE_DIGEST_MISMATCH) and parsed, so what
    was reviewed is what trains. A step that binds no file is refused (PROVENANCE_MISSING), as a
    data reference without decontamination provenance is."""
    from ito_assets.data.sources import read_verified_bytes  # the data plane (polars): not at import

    ref, kind, fields = _bound(step)
    return _parse(read_verified_bytes(ref, data_root), ref.uri, kind, fields)
