"""Eval suite: a JSONL file of items (id, benchmark, question, answer) and its digest.

The suite id is declared by the file's first line when that line is `{"suite_id": "<name>"}`, so
that the file may be named anything; a file without it goes by its stem (the committed suite
does, and reviewed manifests name it so). The digest is sha256 over the file's bytes, header
(and a leading BOM) included, so an auditor can reproduce it with `sha256sum`. Manifests bind to both through their
decontamination provenance.
"""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ito_assets.digests import Digest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import MAX_NAME_LENGTH, NAME_PATTERN
from ito_assets.manifest.strict_json import StrictJsonError, loads_strict

SUITE_ID_KEY = "suite_id"
# The documents' form (`ito_assets.data.text.NORMALIZATION_FORM`): decontamination matches an item's
# words against NFC documents, so an item written decomposed (NFD) would match none of its copies.
TEXT_FORM = "NFC"
MAX_ITEM_ID_CHARS = 256  # `ito audit eval-item` takes exactly the ids a suite can hold
BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark, which some editors put at a file's start
MAX_SUITE_BYTES = 64 * 1024 * 1024  # a suite is text; bounds memory on a misconfigured path


def _has_text(value: str) -> str:
    """Refuses a field of whitespace alone (Unicode's, as `str.strip` reads it): a blank question
    gives decontamination nothing to look for, a blank answer is "matched" by an empty generation
    (`training.evaluation` compares stripped texts), and a blank id or benchmark names nothing."""
    if not value.strip():
        raise ValueError("whitespace alone")
    return value


_HAS_TEXT = AfterValidator(_has_text)


class EvalItem(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, hide_input_in_errors=True)

    # No NUL: an id is given back on a command line (`ito audit eval-item`), which cannot carry one.
    id: Annotated[str, Field(min_length=1, max_length=MAX_ITEM_ID_CHARS, pattern=r"^[^\x00]+$"), _HAS_TEXT]
    benchmark: Annotated[str, Field(min_length=1, max_length=128), _HAS_TEXT]
    question: Annotated[str, Field(min_length=1), _HAS_TEXT]
    answer: Annotated[str, Field(min_length=1), _HAS_TEXT]


@dataclass(frozen=True)
class EvalSuite:
    suite_id: str
    digest: Digest
    items: tuple[EvalItem, ...]

    def by_benchmark(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item.benchmark] = counts.get(item.benchmark, 0) + 1
        return dict(sorted(counts.items()))


def is_suite_id(text: str) -> bool:
    """Whether `text` can name a suite in a manifest's provenance (the schema's `Name`)."""
    return len(text) <= MAX_NAME_LENGTH and re.fullmatch(NAME_PATTERN, text) is not None


def parse_suite(default_id: str, data: bytes) -> EvalSuite:
    """The suite in `data`; its id is the one the first line declares, else `default_id`. A BOM
    at the file's start is skipped, as the corpora's reader skips it (one anywhere else is not
    JSON); the digest stays the file's bytes, BOM included, so `sha256sum` still reproduces it.
    Questions and answers are read in NFC, the form documents are stored in."""
    declared: str | None = None
    items: list[EvalItem] = []
    seen: set[str] = set()
    for number, line in enumerate(data.removeprefix(BOM).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            document = loads_strict(line)  # refuses duplicate keys and NaN before validation
            if not items and declared is None and isinstance(document, dict) and SUITE_ID_KEY in document:
                declared = _declared_id(document, number)  # one header at most, before any item
                continue
            item = EvalItem.model_validate_json(line, strict=True)
        except (StrictJsonError, ValidationError):
            raise ItoError(ErrorCode.EVAL_SUITE_INVALID, f"eval suite line {number} is not a valid item") from None
        key = unicodedata.normalize(TEXT_FORM, item.id)  # ids that print the same name the same item
        if key in seen:
            raise ItoError(ErrorCode.EVAL_SUITE_INVALID, f"eval suite line {number} repeats an item id")
        seen.add(key)
        items.append(_composed(item))
    if not items:
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, "the eval suite has no items")
    return EvalSuite(suite_id=declared or default_id, digest=Digest.of_bytes(data), items=tuple(items))


def _composed(item: EvalItem) -> EvalItem:
    """The item with its question and answer in the documents' form; its id stays as written."""
    return item.model_copy(update={"question": unicodedata.normalize(TEXT_FORM, item.question),
                                   "answer": unicodedata.normalize(TEXT_FORM, item.answer)})


def _declared_id(header: dict, number: int) -> str:
    value = header[SUITE_ID_KEY]
    if set(header) != {SUITE_ID_KEY} or not isinstance(value, str) or not is_suite_id(value):
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, f"eval suite line {number} is not a valid header: "
                       '{"suite_id": "<letters, digits, . _ ->"} alone')
    return value


def load_suite(path: Path) -> EvalSuite:
    return parse_suite(path.stem, read_suite_bytes(path))


def read_suite_bytes(path: Path) -> bytes:
    """The suite file's bytes, read through one descriptor: what is checked (a regular file, within
    MAX_SUITE_BYTES) is what is read, whatever replaces the path or grows the file meanwhile; at
    most MAX_SUITE_BYTES + 1 bytes are ever read, and a pipe or device at the path is never waited
    on. Every refusal is EVAL_SUITE_INVALID, never an OSError."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a device or pipe is not even opened
            raise _not_regular()
        # O_NONBLOCK: a pipe swapped in after the check is opened without waiting for a writer.
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise _not_regular()
            if info.st_size > MAX_SUITE_BYTES:
                raise _too_large()
            data = handle.read(info.st_size + 1)  # no buffer of the bound's size for a small file
            if len(data) > info.st_size:  # it grew after its size was read (or its size reads 0, /proc's)
                data += handle.read(MAX_SUITE_BYTES + 1 - len(data))
    except (FileNotFoundError, NotADirectoryError):
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, "the eval suite file does not exist") from None
    except OSError as error:  # a file this user may not read, a name too long, a device's fault
        reason = (error.strerror or type(error).__name__).lower()
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, f"the eval suite file cannot be read ({reason})") from None
    if len(data) > MAX_SUITE_BYTES:  # it grew after its size was read
        raise _too_large()
    return data


def _not_regular() -> ItoError:
    return ItoError(ErrorCode.EVAL_SUITE_INVALID, "the eval suite path is not a regular file (a folder, a device or a pipe)")


def _too_large() -> ItoError:
    return ItoError(ErrorCode.EVAL_SUITE_INVALID, f"the eval suite file is too large (over {MAX_SUITE_BYTES} bytes)")
