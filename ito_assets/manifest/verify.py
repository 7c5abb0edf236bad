"""Manifest verification: secure read -> strict JSON -> secret scan -> schema, in that order.

The secret scan runs before the schema so that a credential in an unknown field is reported as
MANIFEST_CONTAINS_SECRET, and schema errors are reported by field location only, never by value.
The digest is over the very bytes that were parsed; the path is never opened twice.

Both kinds go through the same steps. The data stage takes either (`parse_data_manifest`: a
training manifest names its data as a data manifest does); everything that trains, books or spends
takes a training manifest only (`parse_manifest`).
"""

from __future__ import annotations

import functools
import hmac
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

from pydantic import ValidationError

from ito_assets.digests import Digest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest import secrets
from ito_assets.manifest.schema import (DATA_KIND, SCHEMA_WORDS, TRAINING_KIND, DataManifest, Manifest, fields_at,
                                        is_digest_field, manifest_kind)
from ito_assets.manifest.secure_read import DEFAULT_MAX_BYTES, ManifestBytes, read_manifest_bytes
from ito_assets.manifest.strict_json import StrictJsonError, loads_strict

_MAX_REPORTED_FIELDS = 5


@dataclass(frozen=True)
class VerifiedManifest:
    manifest: DataManifest  # a training `Manifest` (a DataManifest with more), or a data manifest
    raw: ManifestBytes

    @property
    def is_training(self) -> bool:
        return isinstance(self.manifest, Manifest)

    @property
    def digest(self) -> Digest:
        return self.raw.digest

    @property
    def short_digest(self) -> str:
        return self.raw.digest.short


# How far an unknown key may be from a word of the schema to be shown as its typo: edits (a letter
# added, dropped or changed; letter case aside), so a key shown holds at most this many characters
# of the caller's own.
_TYPO_EDITS = 2


def _edits(a: str, b: str, bound: int) -> int:
    """Levenshtein distance of `a` and `b`, or `bound` + 1 when it is past `bound`."""
    if abs(len(a) - len(b)) > bound:
        return bound + 1
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        if min(current) > bound:
            return bound + 1
        previous = current
    return previous[-1]


@functools.lru_cache(maxsize=4096)
def _closest(key: str, words: frozenset[str], *, any_case: bool = False) -> str | None:
    """The word of `words` within `_TYPO_EDITS` of `key` (the nearest, then the first in order);
    `any_case`: letter case aside (for a suggestion, which shows the schema's spelling only)."""
    fold = str.lower if any_case else str
    scored = sorted((_edits(fold(key), fold(word), _TYPO_EDITS), word) for word in words)
    return scored[0][1] if scored and scored[0][0] <= _TYPO_EDITS else None


def _shown_key(key: str) -> str:
    """A key as a refusal shows it: a word of the schema, a near miss of one (a typo, as the
    schema spells it but for two characters), or only a credential's common name (`password`).
    Any other key is the caller's own text, which may be a secret pasted in the wrong place,
    however short or plain: `<key>`."""
    shown = secrets.shown_key(key)
    if shown == key and (key in SCHEMA_WORDS or secrets.is_credential_word(key) or _closest(key, SCHEMA_WORDS)):
        return key
    return "<key>"


def _schema_location(err: Any, schema: type[DataManifest]) -> str:
    location = ".".join(str(p) if isinstance(p, int) else _shown_key(p) for p in err["loc"]) or "<root>"
    if err["type"] == "extra_forbidden":
        meant = _closest(err["loc"][-1], fields_at(schema, err["loc"][:-1]), any_case=True)
        if location.endswith("<key>"):
            location = location.removesuffix("<key>") + "<unknown key>"
            return f"{location} (did you mean {meant}?)" if meant else location
        return f"{location} (unknown key; did you mean {meant}?)" if meant else f"{location} (unknown key)"
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return f"{location} ({err['ctx']['error']})"
    return location


def _schema_error(exc: ValidationError, schema: type[DataManifest]) -> ItoError:
    # An unknown field's location holds the caller's key name: shown only as `_shown_key` allows.
    # A rule across fields (a model's validator) is said in its own words, which hold no value of
    # the document (schema.py); a field's own type or range is said by its location alone.
    where = _listed(_schema_location(err, schema) for err in exc.errors())
    return ItoError(ErrorCode.MANIFEST_INVALID, f"the manifest does not match the schema at: {where}")


def _listed(locations: Iterable[str]) -> str:
    """The first locations in order, each once with its count: hidden keys (`<key>`) read alike."""
    counts = sorted(Counter(locations).items())
    shown = ", ".join(f"{where} (x{n})" if n > 1 else where for where, n in counts[:_MAX_REPORTED_FIELDS])
    return shown + (f" (+{len(counts) - _MAX_REPORTED_FIELDS} more)" if len(counts) > _MAX_REPORTED_FIELDS else "")


def parse_data_manifest(raw: ManifestBytes) -> DataManifest:
    """Either kind: a data manifest, or a training manifest (a data manifest with more)."""
    try:
        document: Any = loads_strict(raw.data)
    except StrictJsonError as exc:
        raise ItoError(ErrorCode.MANIFEST_INVALID, f"the manifest is not strict JSON: {exc}") from None
    findings = secrets.scan(document, is_exempt=is_digest_field, shown=_shown_key)
    if findings:
        where = _listed(f"{f.location} ({f.kind})" for f in findings)
        raise ItoError(ErrorCode.MANIFEST_CONTAINS_SECRET, f"the manifest contains secret material at: {where}")
    schema = DataManifest if manifest_kind(document) == DATA_KIND else Manifest
    try:
        # JSON-mode validation of the same bytes: strict JSON semantics (arrays for tuples,
        # integers only as JSON integers); duplicate keys and NaN were refused above.
        return schema.model_validate_json(raw.data, strict=True)
    except ValidationError as exc:
        raise _schema_error(exc, schema) from None


def declared_kind(raw: ManifestBytes) -> str:
    """The kind the bytes declare, read before any check (to choose the job that verifies them): a
    file that is not strict JSON counts as a training manifest, whose verification says why."""
    try:
        return manifest_kind(loads_strict(raw.data))
    except StrictJsonError:
        return TRAINING_KIND


def parse_manifest(raw: ManifestBytes) -> Manifest:
    """A training manifest; a data manifest is refused (it names no model, budget or target)."""
    manifest = parse_data_manifest(raw)
    if not isinstance(manifest, Manifest):
        raise ItoError(ErrorCode.MANIFEST_INVALID, 'a data manifest (kind "data") prepares data only; this needs a training manifest')
    return manifest


def verify_manifest(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> VerifiedManifest:
    raw = read_manifest_bytes(path, max_bytes=max_bytes)
    return VerifiedManifest(manifest=parse_manifest(raw), raw=raw)


def verify_data_manifest(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> VerifiedManifest:
    raw = read_manifest_bytes(path, max_bytes=max_bytes)
    return VerifiedManifest(manifest=parse_data_manifest(raw), raw=raw)


def check_expected_digest(actual: str, expected: str) -> None:
    """Constant-time comparison, case-insensitive hex; `expected` is `sha256:` + 64 hex."""
    try:
        wanted = Digest.parse(expected.strip(), any_case=True)
    except ValueError:
        raise ItoError(ErrorCode.USAGE_ERROR, "--expect-digest must be sha256: followed by 64 hex digits") from None
    if not hmac.compare_digest(wanted.encode(), actual.encode()):
        raise ItoError(ErrorCode.MANIFEST_DIGEST_MISMATCH, "the manifest digest differs from the expected digest")


def provenance_problems(manifest: DataManifest) -> list[str]:
    """Data references without decontamination provenance, by position (every data reference
    must carry it, so that what was removed against which eval suite can be audited)."""
    return [f"data[{i}]" for i, ref in enumerate(manifest.data) if ref.decontamination is None]


def require_provenance(manifest: DataManifest) -> None:
    missing = provenance_problems(manifest)
    if missing:
        raise ItoError(
            ErrorCode.PROVENANCE_MISSING,
            f"data references without decontamination provenance: {', '.join(missing)}",
        )


def eval_suite_mismatches(manifest: DataManifest, suite_id: str, suite_digest: str) -> list[str]:
    """Data references whose provenance names another eval suite or another suite digest."""
    bad = []
    for i, ref in enumerate(manifest.data):
        prov = ref.decontamination
        if prov is not None and (prov.eval_suite_id != suite_id or prov.eval_suite_sha256 != suite_digest):
            bad.append(f"data[{i}]")
    return bad


def planned_parameters(size: str) -> int | None:
    """The exact count `ito plan` shows for a named size (`parameter_count` of the planner's
    config), None for a size the planner does not know."""
    from ito_assets.training.model_config import CONFIGS, parameter_count

    return parameter_count(CONFIGS[size]) if size in CONFIGS else None


def parameters_phrase(model: dict) -> str:
    """`1,115,264 parameters`, as `ito plan` prints it, and the manifest's own figure when it differs."""
    declared = model["manifest_num_parameters"]
    if model["num_parameters"] is None:
        return f"a size the planner does not know; the manifest declares {declared:,} parameters"
    phrase = f"{model['num_parameters']:,} parameters"
    return phrase if declared == model["num_parameters"] else f"{phrase}; the manifest declares {declared:,}"


def summarize(verified: VerifiedManifest) -> dict:
    """The readable summary shown by `ito manifest verify` and in the Dagster UI."""
    m = verified.manifest
    summary = {
        "name": m.name,
        "kind": m.kind,
        "num_data_references": len(m.data),
        "data_references": [
            {"uri": r.uri, "license": r.license, "format": r.format, "has_provenance": r.decontamination is not None}
            for r in m.data
        ],
    }
    if not isinstance(m, Manifest):
        return summary
    return summary | {
        "model": {"size": m.model.size, "num_parameters": planned_parameters(m.model.size),
                  "manifest_num_parameters": m.model.num_parameters, "revision": m.model.revision},
        "num_training_tokens": m.training_target.num_tokens,
        "stages": [s.name for s in m.training_target.stages],
        "post_training": [s.kind for s in m.post_training],
        "budget": {"cap_cents": m.budget.cap_cents, "max_incremental_cents": m.budget.max_incremental_cents},
    }
