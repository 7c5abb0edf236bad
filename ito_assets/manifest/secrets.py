"""Secret scan of every key and value of a parsed manifest (SPEC.md: no raw API key, SSH key,
node password, bearer token or dataset credential may appear in a manifest).

Findings name the field location and the kind of secret, never the value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

# Token formats as published by their issuers (AWS IAM key ids, GitHub token prefixes,
# Hugging Face user tokens, Slack token prefixes) plus generic credential carriers.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("aws_access_key_id", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA|AIDA|AROA)[0-9A-Z]{16}\b")),
    ("aws_secret_access_key", re.compile(r"(?i)aws.{0,20}?[=:]\s*['\"]?[A-Za-z0-9/+]{40}\b")),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b")),
    ("github_fine_grained_token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b")),
    ("hugging_face_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("private_key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")),
    ("bearer_token", re.compile(r"(?i)\b(?:bearer|token)\s+[A-Za-z0-9._~+/-]{16,}=*")),
    ("url_credentials", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("slack_webhook", re.compile(r"hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+")),
    ("ssh_private_key", re.compile(r"-----BEGIN OPENSSH PRIVATE KEY-----")),
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
    for match in _CANDIDATE.finditer(value):
        token = match.group(0)
        mixed = any(c.islower() for c in token) and any(c.isupper() for c in token) and any(
            c.isdigit() for c in token
        )
        if mixed and _entropy(token) >= _ENTROPY_BITS:
            return True
    return False


def value_secret_kind(value: str) -> str | None:
    for kind, pattern in _PATTERNS:
        if pattern.search(value):
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


def _location(path: tuple) -> str:
    out = ""
    for part in path:
        # Key names are shown only when they are not themselves secret-looking.
        out += f"[{part}]" if isinstance(part, int) else f".{part if not value_secret_kind(part) else '<key>'}"
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
