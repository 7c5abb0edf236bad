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

from dataclasses import dataclass
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


def discover(folder: Path, *, max_bytes: int) -> tuple[list[DiscoveredManifest], list[Rejected]]:
    """Every *.json file directly in `folder`, read securely; unreadable ones are reported by code."""
    found: list[DiscoveredManifest] = []
    rejected: list[Rejected] = []
    if not folder.is_dir():
        return found, rejected
    for entry in sorted(folder.iterdir()):
        if entry.suffix != MANIFEST_SUFFIX:
            continue
        try:
            raw = read_manifest_bytes(str(entry.absolute()), max_bytes=max_bytes)
        except ItoError as error:
            rejected.append(Rejected(entry.name, error.code.value))
            continue
        found.append(DiscoveredManifest(str(entry.absolute()), raw.sha256_hex, declared_kind(raw)))
    return found, rejected


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


def judge(path: str, key: str, *, max_bytes: int) -> ManifestVerdict:
    """Either kind verifies here: the data stage takes both; what needs a training manifest
    refuses a data manifest where it acts."""
    try:
        raw = read_manifest_bytes(path, max_bytes=max_bytes)
    except ItoError as error:
        return ManifestVerdict(key, path, None, None, error.code.value, error.message)
    base = dict(key=key, path=path, digest=raw.digest, size_bytes=raw.size)
    if raw.digest.short != key:
        return ManifestVerdict(**base, error_code="MANIFEST_CHANGED", error_message="the manifest changed since it was registered")
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


def locate(folder: Path, key: str, *, max_bytes: int) -> str | None:
    """The path of the manifest registered under `key`, if it is still in the folder."""
    found, _ = discover(folder, max_bytes=max_bytes)
    return next((m.path for m in found if m.key == key), None)


WITHHELD_NAME = "(a name that looks like a credential, withheld)"


def name_looks_secret(file_name: str) -> bool:
    """Whoever drops a manifest chooses its file name: a token saved as its own name must reach no
    log and no metadata, withheld whole (a prefix of one is already too much)."""
    return telemetry.redact(file_name) != file_name or value_secret_kind(file_name) is not None
