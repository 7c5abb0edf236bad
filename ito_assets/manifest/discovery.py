"""Discovery of reviewed manifests in a folder, and the verdict on one manifest.

The folder is the inbox of reviewed manifests awaiting preparation: the sensor registers each
readable one under its short digest and prepares it by its declared kind (a training manifest with
the whole preparation, a data manifest with the data alone), and the job finds the file for a
partition key again. Data manifests written by `ito data prepare` live in the state folder instead (the sensor
never sees them) and are found there the same way. A run created through the API never comes
back here: it trains the bytes the ledger stored when the run was confirmed
(`ito_assets.defs.workload.live`). A verdict is data (never an exception) so that the Dagster
checks can show every failure by its code.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ito_assets.control import telemetry
from ito_assets.digests import Digest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.secure_read import read_manifest_bytes
from ito_assets.manifest.schema import TRAINING_KIND
from ito_assets.manifest.secrets import value_secret_kind
from ito_assets.manifest.strict_json import StrictJsonError, loads_strict
from ito_assets.manifest.verify import VerifiedManifest, declared_kind, parse_data_manifest, summarize

MANIFEST_SUFFIX = ".json"
# A file modified less than this long ago whose bytes are not yet one whole JSON document is taken
# for one still being written (a copy, an editor's save, a transfer) and left for a later look; a
# whole document is read at once, so a manifest dropped in is registered on the next tick. A
# manifest is at most a few MiB (`max_manifest_bytes`), which a local copy writes in well under a
# second; the sensor ticks every 30 s. Older than this, a file that does not parse is refused by
# its verdict (MANIFEST_INVALID) as before.
SETTLE_SECONDS = 5.0
_clock = time.time  # the time files' ages are measured against (a test sets its own)

@dataclass(frozen=True)
class DiscoveredManifest:
    path: str
    sha256_hex: str
    kind: str = TRAINING_KIND  # as declared, not yet verified (`declared_kind`)

    @property
    def key(self) -> str:
        return self.digest.short

    @property
    def digest(self) -> Digest:
        return Digest.of_hex(self.sha256_hex)


@dataclass(frozen=True)
class Rejected:
    file_name: str
    code: str
    detail: str = ""  # what the code alone does not say, for the log (no value from the file)


@dataclass(frozen=True)
class Inbox:
    """What a look at the folder found: manifests read, files refused by code, and the names of
    files too recently modified to read yet (`SETTLE_SECONDS`)."""

    found: list[DiscoveredManifest] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


def scan(folder: Path, *, max_bytes: int, settle_seconds: float = SETTLE_SECONDS, now: float | None = None) -> Inbox:
    """Every *.json file directly in `folder`, read securely; unreadable ones are reported by code,
    and one still being written (modified less than `settle_seconds` before `now`, the clock's
    time when None, and not yet whole JSON) is left for a later look."""
    inbox = Inbox()
    if not folder.is_dir():
        return inbox
    now = _clock() if now is None else now
    for entry in sorted(folder.iterdir()):
        if entry.suffix != MANIFEST_SUFFIX:
            continue
        try:
            raw = read_manifest_bytes(str(entry.absolute()), max_bytes=max_bytes)
        except ItoError as error:
            inbox.rejected.append(Rejected(entry.name, error.code.value))
            continue
        if _recently_modified(entry, now, settle_seconds) and not _strict_json(raw.data):
            inbox.waiting.append(entry.name)
            continue
        inbox.found.append(DiscoveredManifest(str(entry.absolute()), raw.sha256_hex, declared_kind(raw)))
    return inbox


def _recently_modified(entry: Path, now: float, settle_seconds: float) -> bool:
    """Modified less than `settle_seconds` before `now`; a time ahead of `now` by more than that
    is another machine's clock (a network mount), not a write in progress."""
    try:
        modified = os.lstat(entry).st_mtime
    except OSError:  # gone since it was read: the next look reports it
        return False
    return abs(now - modified) < settle_seconds


def discover(folder: Path, *, max_bytes: int) -> tuple[list[DiscoveredManifest], list[Rejected]]:
    """Every *.json file directly in `folder` whatever its age: what a run finds again for its
    partition, where a file cut short is judged (MANIFEST_INVALID, or another digest than the run
    was asked for) rather than missed. What registers new manifests uses `scan`."""
    inbox = scan(folder, max_bytes=max_bytes, settle_seconds=0)
    return inbox.found, inbox.rejected


def colliding(found: list[DiscoveredManifest]) -> dict[str, list[DiscoveredManifest]]:
    """The partition keys (12 hex digits: 48 bits of the digest) that two or more different
    manifests share, each with those manifests. One file copied under two names is one manifest."""
    by_key: dict[str, dict[str, DiscoveredManifest]] = {}
    for manifest in found:
        by_key.setdefault(manifest.key, {}).setdefault(manifest.digest, manifest)
    return {key: list(same.values()) for key, same in by_key.items() if len(same) > 1}


@dataclass(frozen=True)
class ManifestVerdict:
    """The outcome of judging one manifest file: verified content, or the code that refused it."""

    key: str
    path: str
    digest: str | None
    size_bytes: int | None
    error_code: str | None = None
    error_message: str | None = None
    verified: VerifiedManifest | None = None
    # Whether the secret scan read the whole document: it runs once the bytes parse as strict
    # JSON, before the schema, so a manifest the schema refuses was scanned and one cut short
    # was not (False in a verdict stored before this was recorded).
    secrets_scanned: bool = False

    @property
    def ok(self) -> bool:
        return self.verified is not None

    def summary(self) -> dict | None:
        return summarize(self.verified) if self.verified else None


def judge(path: str, key: str, *, max_bytes: int, digest: str | None = None) -> ManifestVerdict:
    """Either kind verifies here: the data stage takes both; what needs a training manifest
    refuses a data manifest where it acts. `digest`: the full digest the run was asked for (its
    tag), where it names one: the partition key is 48 bits of it, which two manifests can share."""
    try:
        raw = read_manifest_bytes(path, max_bytes=max_bytes)
    except ItoError as error:
        return ManifestVerdict(key, path, None, None, error.code.value, error.message)
    base = dict(key=key, path=path, digest=raw.digest, size_bytes=raw.size)
    if raw.digest.short != key:
        return ManifestVerdict(**base, error_code="MANIFEST_CHANGED", error_message="the manifest changed since it was registered")
    if digest is not None and raw.digest != digest:
        return ManifestVerdict(**base, error_code=ErrorCode.MANIFEST_DIGEST_MISMATCH.value,
                               error_message=f"the manifest under partition key {key} is {raw.digest}, not {digest}, "
                               "the one this run was asked for: another manifest shares the key or replaced the file")
    try:
        manifest = parse_data_manifest(raw)
    except ItoError as error:
        scanned = error.code is ErrorCode.MANIFEST_CONTAINS_SECRET or _strict_json(raw.data)
        return ManifestVerdict(**base, error_code=error.code.value, error_message=error.message, secrets_scanned=scanned)
    return ManifestVerdict(**base, verified=VerifiedManifest(manifest=manifest, raw=raw), secrets_scanned=True)


def _strict_json(data: bytes) -> bool:
    try:
        loads_strict(data)
    except StrictJsonError:
        return False
    return True


def locate(folder: Path | tuple[Path, ...], key: str, *, max_bytes: int, digest: str | None = None) -> str | None:
    """The path of the manifest registered under `key`, if it is still in the folder (or the first
    of the folders that has it): the one with the full `digest` where it is given and in any of
    them, else the first under the key (which `judge`, given the digest, then refuses by code)."""
    found = [m for f in (folder if isinstance(folder, tuple) else (folder,)) for m in discover(f, max_bytes=max_bytes)[0]]
    exact = next((m.path for m in found if digest is not None and m.digest == digest), None)
    return exact or next((m.path for m in found if m.key == key), None)


WITHHELD_NAME = "(a name that looks like a credential, withheld)"


def name_looks_secret(file_name: str) -> bool:
    """Whoever drops a manifest chooses its file name: a token saved as its own name must reach no
    log and no metadata, withheld whole (a prefix of one is already too much)."""
    return telemetry.redact(file_name) != file_name or value_secret_kind(file_name) is not None
