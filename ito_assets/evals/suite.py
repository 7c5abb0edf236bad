"""Eval suite: a JSONL file of items (id, benchmark, question, answer) and its digest.

The suite id is the file's stem; the digest is sha256 over the file's bytes, so an auditor can
reproduce it with `sha256sum`. Manifests bind to both through their decontamination provenance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ito_assets.digests import Digest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.strict_json import StrictJsonError, loads_strict

MAX_SUITE_BYTES = 64 * 1024 * 1024  # a suite is text; bounds memory on a misconfigured path


class EvalItem(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, hide_input_in_errors=True)

    id: Annotated[str, Field(min_length=1, max_length=256)]
    benchmark: Annotated[str, Field(min_length=1, max_length=128)]
    question: Annotated[str, Field(min_length=1)]
    answer: Annotated[str, Field(min_length=1)]


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


def parse_suite(suite_id: str, data: bytes) -> EvalSuite:
    items: list[EvalItem] = []
    seen: set[str] = set()
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            loads_strict(line)  # refuses duplicate keys and NaN before validation
            item = EvalItem.model_validate_json(line, strict=True)
        except (StrictJsonError, ValidationError):
            raise ItoError(ErrorCode.EVAL_SUITE_INVALID, f"eval suite line {number} is not a valid item") from None
        if item.id in seen:
            raise ItoError(ErrorCode.EVAL_SUITE_INVALID, f"eval suite line {number} repeats an item id")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, "the eval suite has no items")
    return EvalSuite(suite_id=suite_id, digest=Digest.of_bytes(data), items=tuple(items))


def load_suite(path: Path) -> EvalSuite:
    if not path.is_file():
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, "the eval suite file does not exist")
    if path.stat().st_size > MAX_SUITE_BYTES:
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID, "the eval suite file is too large")
    return parse_suite(path.stem, path.read_bytes())
