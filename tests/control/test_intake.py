"""Gate 2 in the core: the server hashes the bytes it received, compares them with the claimed
digest, bounds their size and parses them with the client's checks; the ledger keeps each
manifest's bytes once, under their digest."""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
import pytest

from gate_world import manifest_bytes
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import intake
from ito_assets.control.ledger import manifests

CONTENT = manifest_bytes()
RIGHT = "sha256:" + hashlib.sha256(CONTENT).hexdigest()


def code_of(content: bytes, claimed, max_bytes: int = 1 << 20) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        intake.verify_submitted(content, claimed, max_bytes=max_bytes)
    return info.value.code


def test_the_right_digest_yields_the_parsed_manifest_of_those_bytes() -> None:
    verified = intake.verify_submitted(CONTENT, RIGHT, max_bytes=len(CONTENT))
    assert verified.digest == RIGHT and verified.raw.data == CONTENT and verified.raw.size == len(CONTENT)
    assert verified.manifest.name


@pytest.mark.parametrize("claimed", [
    "sha256:" + hashlib.sha256(CONTENT + b" ").hexdigest(),  # other bytes
    RIGHT[:-1] + ("0" if RIGHT[-1] != "0" else "1"),           # one digit off
    "sha256:" + hashlib.sha256(b"").hexdigest(),
])
def test_a_wrong_claimed_digest_is_a_digest_mismatch(claimed) -> None:
    assert code_of(CONTENT, claimed) is ErrorCode.MANIFEST_DIGEST_MISMATCH


@pytest.mark.parametrize("claimed", ["", RIGHT.upper(), RIGHT[:-1], RIGHT + "0", RIGHT.removeprefix("sha256:"),
                                     " " + RIGHT, RIGHT + "\n", None, 12, ["sha256:"]])
def test_a_malformed_claimed_digest_is_a_usage_error(claimed) -> None:
    assert code_of(CONTENT, claimed) is ErrorCode.USAGE_ERROR


def test_the_size_bound_admits_exactly_its_limit() -> None:
    assert intake.verify_submitted(CONTENT, RIGHT, max_bytes=len(CONTENT)).raw.size == len(CONTENT)
    assert code_of(CONTENT, RIGHT, max_bytes=len(CONTENT) - 1) is ErrorCode.MANIFEST_TOO_LARGE


def test_the_size_bound_comes_before_hashing_and_parsing() -> None:
    """An oversized body is refused as too large even when its digest is wrong or it is no JSON."""
    assert code_of(b"x" * 11, "sha256:" + "0" * 64, max_bytes=10) is ErrorCode.MANIFEST_TOO_LARGE


def test_bytes_that_match_their_digest_are_still_parsed_with_the_clients_checks() -> None:
    bad = b'{"name": "a", "name": "b"}'
    assert code_of(bad, "sha256:" + hashlib.sha256(bad).hexdigest()) is ErrorCode.MANIFEST_INVALID


def test_the_ledger_keeps_each_manifest_once_under_its_digest(ledger) -> None:
    verified = intake.verify_submitted(CONTENT, RIGHT, max_bytes=1 << 20)
    with ledger.write() as conn:
        intake.store(conn, verified, now=100)
        intake.store(conn, verified, now=200)
    with ledger.read() as conn:
        rows = conn.execute(sa.select(manifests)).mappings().all()
    assert [(r["digest"], bytes(r["content"]), r["size_bytes"], r["first_seen_at"]) for r in rows] == [
        (RIGHT, CONTENT, len(CONTENT), 100)]
