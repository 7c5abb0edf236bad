"""Gate 4's pure half: the idempotency key's form and the request fingerprint.

Stdlib and the manifest secret patterns only: the client checks a key before any network call.
"""

from __future__ import annotations

import hashlib
import json
import re

from ito_assets.errors import ErrorCode, ItoError

# 8-128 characters of a conservative alphabet: room for a UUID (36) or a ULID (26) with a prefix;
# 128 bounds the index (the IETF draft "The Idempotency-Key HTTP Header Field" recommends UUIDs).
# Any URL-safe base64 character may come first, so every secrets.token_urlsafe key fits (one in
# 32 starts with '-' or '_'; on the command line such a key is given as --idempotency-key=KEY).
IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._:-]{7,127}$")
# This API's own secrets (identity tokens, confirmation references) are refused wherever they
# stand in a key, whatever is glued to them: the key's alphabet is the tokens' own, so no
# boundary can be told, and even a token cut short by a character or two can be guessed.
# The prefixes are case-sensitive, as the secrets are (ids.TOKEN, ids.CONFIRMATION_REF).
_OWN_SECRET_PREFIXES = ("ito_desk_", "ito_acct_", "cfr_")


def validate_key(key: object, *, lookup: bool = False) -> str:
    """A well-formed key that does not look like a credential: keys are echoed in every answer
    and the audit trail, so a pasted token must never be accepted as one.

    Only known credential formats are refused, not high entropy: a good key is random by design
    (secrets.token_urlsafe(16) or more), and the entropy rule refused most such keys of 32
    characters and up. `lookup`: a key only looked up, which writes nothing; one an older release
    stored with this API's prefixes inside it (`nightly-cfr_1`) is still found."""
    from ito_assets.manifest.secrets import pattern_secret_kind

    if not isinstance(key, str) or IDEMPOTENCY_KEY.fullmatch(key) is None:
        raise ItoError(ErrorCode.IDEMPOTENCY_KEY_INVALID,
                       "the idempotency key must be 8-128 characters of letters, digits, '.', '_', ':' or '-'")
    if (pattern_secret_kind(key) is not None or key.startswith(("ito_", "cfr_"))
            or (not lookup and any(prefix in key for prefix in _OWN_SECRET_PREFIXES))):
        raise ItoError(ErrorCode.IDEMPOTENCY_KEY_INVALID, "the idempotency key looks like a secret; use a random id")
    return key


def request_fingerprint(action: str, **params: object) -> str:
    """sha256 over the canonical JSON of what the request asks for. The confirmation reference is
    not part of it: a retry with a fresh confirmation is still the same request."""
    canonical = json.dumps({"action": action, **params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def cleanup_fingerprint(release_booking_id: str | None) -> str:
    """A cleanup's, which the client computes too, to tell its own cleanup's answer from another's
    after a lost answer; the account has no place in it, since a key is the account's own."""
    return request_fingerprint("cleanup", release_booking_id=release_booking_id)
