"""Gate 2 on the server: the manifest bytes the client sent are hashed again and must equal the
digest it claims; then they are parsed with the very checks the client ran (strict JSON, secret
scan, schema). The server never trusts the client's parse, only its bytes.
"""

from __future__ import annotations

import hashlib
import hmac

import sqlalchemy as sa

from ito_assets.digests import Digest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.ledger import insert_if_absent, manifests
from ito_assets.manifest.secure_read import ManifestBytes
from ito_assets.manifest.verify import VerifiedManifest, parse_manifest


def verify_submitted(content: bytes, claimed_digest: str, *, max_bytes: int) -> VerifiedManifest:
    try:
        claimed_digest = Digest.parse(claimed_digest)
    except ValueError:
        raise ItoError(ErrorCode.USAGE_ERROR, "manifest_digest must be sha256: followed by 64 lowercase hex digits") from None
    if len(content) > max_bytes:
        raise ItoError(ErrorCode.MANIFEST_TOO_LARGE, "the manifest exceeds the size limit")
    raw = ManifestBytes(data=content, sha256_hex=hashlib.sha256(content).hexdigest())
    if not hmac.compare_digest(raw.digest.encode(), claimed_digest.encode()):
        raise ItoError(ErrorCode.MANIFEST_DIGEST_MISMATCH, "the manifest bytes do not hash to the claimed digest")
    return VerifiedManifest(manifest=parse_manifest(raw), raw=raw)


def stored_content(conn: sa.Connection, digest: str) -> bytes | None:
    """The bytes stored under `digest` as they are now, unverified (None when there are none)."""
    content = conn.execute(sa.select(manifests.c.content).where(manifests.c.digest == digest)).scalar_one_or_none()
    return None if content is None else bytes(content)


def stored(conn: sa.Connection, digest: str) -> ManifestBytes:
    """The exact bytes a run was confirmed with, read back by their digest and verified."""
    content = stored_content(conn, digest)
    if content is None:
        raise ItoError(ErrorCode.RUN_NOT_FOUND, "no manifest stored under this digest")
    return verify_stored(content, digest)


def verify_stored(content: bytes | None, digest: str) -> ManifestBytes:
    """Stored bytes that no longer hash to their digest (a tampered or lost row) are refused, never parsed."""
    raw = None if content is None else ManifestBytes(data=content, sha256_hex=hashlib.sha256(content).hexdigest())
    if raw is None or not hmac.compare_digest(raw.digest.encode(), digest.encode()):
        raise ItoError(ErrorCode.MANIFEST_DIGEST_MISMATCH, "the stored manifest no longer matches its digest")
    return raw


def store(conn: sa.Connection, verified: VerifiedManifest, *, now: int) -> None:
    """Keep the bytes under their digest once (content-addressed; a concurrent twin's insert is a no-op)."""
    insert_if_absent(conn, manifests, dict(digest=verified.digest, content=verified.raw.data,
                                           size_bytes=verified.raw.size, first_seen_at=now))
