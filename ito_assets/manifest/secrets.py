"""Secret scan of every key and value of a parsed manifest: no raw API key, SSH key, node
password, bearer token or dataset credential may appear in one (it is reviewed, stored, shown).

Findings name the field location and the kind of secret, never the value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

# Token formats as published by their issuers (AWS IAM key ids, GitHub token prefixes,
# Hugging Face user tokens, Slack token prefixes, OpenAI, Stripe, Google and GitLab keys) plus
# generic credential carriers. The provider keys after ssh_private_key may follow "_" or "-"
# (ENV_NAME_sk-...), so they are anchored on "no letter or digit before", not on \b.
_NOT_AFTER_ALNUM = r"(?<![A-Za-z0-9])"


class _Jwt:
    """A JWT: header and payload `eyJ...` (base64url of a JSON object) and a signature, joined by
    dots. One regex for it restarts after every "-" of a long run and takes quadratic time; this
    reads each maximal run of base64url characters and dots once, as dot-separated segments."""

    _RUN = re.compile(r"[A-Za-z0-9_.-]+")
    _HEAD = re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\Z")
    _PAYLOAD = re.compile(r"eyJ[A-Za-z0-9_-]{5,}")

    def search(self, value: str) -> bool:
        for run in self._RUN.finditer(value):
            segments = run.group(0).split(".")
            for head, payload, signature in zip(segments, segments[1:], segments[2:]):
                if len(signature) >= 5 and self._PAYLOAD.fullmatch(payload) and self._HEAD.search(head):
                    return True
        return False


_PATTERNS: tuple[tuple[str, "re.Pattern[str] | _Jwt"], ...] = (
    ("aws_access_key_id", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA|AIDA|AROA)[0-9A-Z]{16}\b")),
    ("aws_secret_access_key", re.compile(r"(?i)aws.{0,20}?[=:]\s*['\"]?[A-Za-z0-9/+]{40}\b")),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b")),
    ("github_fine_grained_token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b")),
    ("hugging_face_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("private_key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")),
    ("jwt", _Jwt()),
    ("bearer_token", re.compile(r"(?i)\b(?:bearer|token)\s+[A-Za-z0-9._~+/-]{16,}=*")),
    # Userinfo with a password, or a query parameter named like a credential (?token=, &sig=,
    # X-Amz-Signature=, ?api_key=). Anchored on "://" and on "?&;", never on the scheme: a scheme
    # pattern restarts at every letter of a long word and takes quadratic time.
    ("url_credentials", re.compile(
        r"://[^/\s:@]+:[^/\s@]+@"
        r"|(?i:[?&;](?:[a-z0-9_.-]*[_.-])?"
        r"(?:token|sig|signature|password|passwd|pwd|secret|credential|auth|api_?key|access_?key|secret_?key)"
        r"=[^&#\s]{4,})")),
    # Bot, user, legacy and refresh tokens (xoxb-, xoxp-, xoxe-...) and app-level tokens (xapp-).
    ("slack_token", re.compile(r"\b(?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,}")),
    ("slack_webhook", re.compile(r"hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+")),
    ("ssh_private_key", re.compile(r"-----BEGIN OPENSSH PRIVATE KEY-----")),
    # OpenAI: user keys "sk-" and 48 letters or digits; project, service-account and admin keys
    # "sk-proj-", "sk-svcacct-", "sk-admin-" and a longer URL-safe body (no fixed length is
    # published; 40 is well below every issued one).
    ("openai_api_key",
     re.compile(_NOT_AFTER_ALNUM + r"sk-(?:[A-Za-z0-9]{48}|(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,})")),
    # Stripe secret and restricted keys, live and test (publishable pk_ keys are public by design);
    # Stripe's security team gave secret scanners bodies of 10 to 128 letters and digits.
    ("stripe_api_key", re.compile(_NOT_AFTER_ALNUM + r"[sr]k_(?:live|test)_[A-Za-z0-9]{10,}")),
    # Google API keys: "AIza" and 35 URL-safe characters, 39 in all.
    ("google_api_key", re.compile(_NOT_AFTER_ALNUM + r"AIza[A-Za-z0-9_-]{35}")),
    # GitLab personal access tokens: "glpat-" and at least 20 URL-safe characters (newer,
    # routable tokens are longer and continue with ".01." and more).
    ("gitlab_token", re.compile(_NOT_AFTER_ALNUM + r"glpat-[A-Za-z0-9_-]{20,}")),
)

# Key names that carry credentials. Matched on whole words of the key (snake, kebab or camel
# case), so `num_tokens` or `tokenizer` are not flagged but `hf_token` and `apiKey` are.
_SECRET_WORDS = frozenset(
    {"password", "passwd", "pwd", "secret", "secrets", "credential", "credentials", "apikey",
     "token", "authorization", "auth", "privatekey", "passphrase", "cookie", "session"}
)
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"), ("client", "secret"),
     ("auth", "token"), ("access", "token"), ("refresh", "token"), ("ssh", "key"), ("bearer", "token")}
)

# Generic high-entropy strings: long, mixed-class tokens. 4.2 bits/char sits above English
# words and lowercase hex (at most 4.0) and below random base64 (about 5-6 at these lengths).
_CANDIDATE = re.compile(r"[A-Za-z0-9+/_=-]{32,}")
_ENTROPY_BITS = 4.2
# A URI is judged per "/"-separated segment: mixed-case directory names with digits, joined into
# one run, reach a token's entropy although no segment is one (dataroot://Corpora/Stdlib2026/...).
# A bare base64 token keeps its "/" (it has no scheme), so it is still judged whole.
# Only the part from "://" on holds slashes; matching the scheme too would restart at every letter.
_URI = re.compile(r"://\S*")


@dataclass(frozen=True)
class SecretFinding:
    location: str  # e.g. "data[0].uri" or "model.<key>"; never the value
    kind: str


def _key_words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def key_looks_secret(key: str) -> bool:
    words = _key_words(key)
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in zip(words, words[1:]))


def _entropy(token: str) -> float:
    counts = Counter(token)
    return -sum(c / len(token) * math.log2(c / len(token)) for c in counts.values())


def _high_entropy(value: str) -> bool:
    value = _URI.sub(lambda uri: uri.group(0).replace("/", " "), value)
    for match in _CANDIDATE.finditer(value):
        token = match.group(0)
        mixed = any(c.islower() for c in token) and any(c.isupper() for c in token) and any(
            c.isdigit() for c in token
        )
        if mixed and _entropy(token) >= _ENTROPY_BITS:
            return True
    return False


def pattern_secret_kind(value: str) -> str | None:
    """The kind of the first known credential format found in `value` (no entropy rule): for
    values meant to be random, such as idempotency keys, where high entropy is no evidence."""
    for kind, pattern in _PATTERNS:
        if pattern.search(value):
            return kind
    return None


def value_secret_kind(value: str) -> str | None:
    kind = pattern_secret_kind(value)
    if kind is not None:
        return kind
    return "high_entropy_string" if _high_entropy(value) else None


def _walk(value: Any, path: tuple) -> Iterator[tuple[tuple, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, path + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _walk(child, path + (index,))


# A key name shown in a message: printable ASCII without spaces and short. Anything else (a
# newline that forges a log line, a terminal escape, a bidi override, a 100 KB name) is `<key>`.
_SHOWABLE_KEY = re.compile(r"[\x21-\x7e]{1,64}")


def shown_key(key: str) -> str:
    """`key` as an error message may show it: itself, or `<key>` when it looks like a secret or
    could disguise or flood the message."""
    if not _SHOWABLE_KEY.fullmatch(key) or value_secret_kind(key):
        return "<key>"
    return key


def _location(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{shown_key(part)}"
    return out.lstrip(".") or "<root>"


def scan(document: Any, *, is_exempt: Callable[[tuple, str], bool] = lambda p, v: False) -> list[SecretFinding]:
    """Every secret-looking key or value in `document`; `is_exempt(path, value)` spares values the
    schema validates as digests."""
    findings: list[SecretFinding] = []
    for path, value in _walk(document, ()):
        if path and isinstance(path[-1], str):
            kind = value_secret_kind(path[-1]) or ("credential_key_name" if key_looks_secret(path[-1]) else None)
            if kind:
                findings.append(SecretFinding(_location(path), kind))
        if isinstance(value, str) and not is_exempt(path, value):
            kind = value_secret_kind(value)
            if kind:
                findings.append(SecretFinding(_location(path), kind))
    return findings
