"""A property test of the manifest reader: whatever the bytes, it answers a manifest or an
ItoError with a manifest code, never another exception (no traceback reaches a caller)."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import examples, valid_manifest
from ito_assets.errors import ItoError
from ito_assets.control import intake
from ito_assets.manifest.secure_read import ManifestBytes
from ito_assets.manifest.verify import parse_manifest

READER_CODES = {"MANIFEST_INVALID", "MANIFEST_CONTAINS_SECRET", "MANIFEST_TOO_LARGE", "MANIFEST_DIGEST_MISMATCH",
                "USAGE_ERROR"}
HUGE = st.sampled_from([10**23, -(10**23), 10**4000, 2**63, 10**15 + 1, 1e308, -0.0, 0])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(), HUGE, st.floats(allow_nan=False, allow_infinity=False),
                 st.text(max_size=40), st.sampled_from(["\x00", "\u2028", "\x1b[2J", "ghp_" + "A1b2" * 9]))
VALUE = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                     max_leaves=12)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


PATHS = [p for p in _paths(valid_manifest()) if p]


def _read(data: bytes) -> None:
    try:
        parse_manifest(ManifestBytes(data=data, sha256_hex=hashlib.sha256(data).hexdigest()))
    except ItoError as error:
        assert error.code.value in READER_CODES, error.code


def _replace(document: dict, path: tuple, value) -> dict:
    changed = copy.deepcopy(document)
    node = changed
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return changed


@pytest.mark.fuzz
@settings(max_examples=examples(300, 3000), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=VALUE)
def test_any_value_anywhere_in_a_valid_manifest(path, value) -> None:
    _read(json.dumps(_replace(valid_manifest(), path, value)).encode())


@pytest.mark.fuzz
@settings(max_examples=examples(300, 3000), deadline=None, derandomize=True)
@given(data=st.binary(max_size=512))
def test_any_bytes(data) -> None:
    _read(data)


@pytest.mark.fuzz
@settings(max_examples=examples(200, 2000), deadline=None, derandomize=True)
@given(cut=st.integers(min_value=0), flip=st.integers(min_value=0, max_value=255))
def test_a_valid_manifest_truncated_or_with_a_byte_changed(cut, flip) -> None:
    data = json.dumps(valid_manifest(), indent=2).encode()
    _read(data[:cut % len(data)])
    index = cut % len(data)
    _read(data[:index] + bytes([data[index] ^ flip]) + data[index + 1:])


@pytest.mark.fuzz
@settings(max_examples=examples(100, 1000), deadline=None, derandomize=True)
@given(data=st.binary(max_size=256), claimed=st.text(max_size=80))
def test_the_servers_intake_of_any_bytes_and_any_claimed_digest(data, claimed) -> None:
    for digest in (claimed, "sha256:" + hashlib.sha256(data).hexdigest()):
        try:
            intake.verify_submitted(data, digest, max_bytes=128)
        except ItoError as error:
            assert error.code.value in READER_CODES, error.code
