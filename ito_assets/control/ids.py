"""Opaque identifiers and secrets: run ids, confirmation references, identity tokens.

Light on purpose (stdlib only): the client validates the form of a confirmation reference before
any network call, so this module is imported at client start.
"""

from __future__ import annotations

import hashlib
import re
import secrets

# Crockford's base32 alphabet, lower case: no i, l, o, u, so a reference read aloud or copied by
# hand cannot be confused. 26 characters carry 130 bits, the size of a ULID.
ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_BODY_LENGTH = 26

CONFIRMATION_REF = re.compile(rf"^cfr_[{ALPHABET}]{{{_BODY_LENGTH}}}$")
RUN_ID = re.compile(rf"^run_[{ALPHABET}]{{{_BODY_LENGTH}}}$")
BOOKING_ID = re.compile(rf"^bkg_[{ALPHABET}]{{{_BODY_LENGTH}}}$")
# Identity tokens: 32 random bytes (256 bits), url-safe base64 without padding -> 43 characters.
TOKEN = re.compile(r"^ito_(desk|acct)_[A-Za-z0-9_-]{43}$")


def new_id(prefix: str) -> str:
    return prefix + "_" + "".join(secrets.choice(ALPHABET) for _ in range(_BODY_LENGTH))


def new_confirmation_ref() -> str:
    return new_id("cfr")


def new_run_id() -> str:
    return new_id("run")


def new_token(role: str) -> str:
    kind = {"desk": "desk", "account": "acct"}[role]
    return f"ito_{kind}_{secrets.token_urlsafe(32)}"


def is_confirmation_ref(value: str) -> bool:
    return isinstance(value, str) and CONFIRMATION_REF.fullmatch(value) is not None


def is_run_id(value: str) -> bool:
    return isinstance(value, str) and RUN_ID.fullmatch(value) is not None


def is_booking_id(value: str) -> bool:
    return isinstance(value, str) and BOOKING_ID.fullmatch(value) is not None


def secret_hash(value: str) -> str:
    """sha256 hex of a high-entropy secret (tokens, references). A salted slow hash protects
    low-entropy passwords; 130- and 256-bit random values cannot be brute-forced from a plain
    sha256, which is also what GitHub and PyPI store for their API tokens."""
    return hashlib.sha256(value.encode("ascii")).hexdigest()
