"""Provider key formats in the secret scanner: OpenAI, Stripe, Google, GitLab (and the GitHub
fine-grained and Slack formats it already knew), each at its issuer's length, one character short,
with a wrong prefix and glued to a word; found in manifests, in run logs and in idempotency keys.
Random idempotency keys (secrets.token_urlsafe) are never taken for secrets."""

from __future__ import annotations

import random
import secrets as stdlib_secrets
import string
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.fingerprint import validate_key
from ito_assets.control.ids import new_token
from ito_assets.control.telemetry import REDACTED, redact
from ito_assets.manifest.secrets import SecretFinding, pattern_secret_kind, scan, value_secret_kind

ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "-_"


def body(alphabet: str, length: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(length))


# kind -> (prefix, alphabet of the body, the shortest body the issuer's format allows)
FORMATS = {
    "openai_api_key": [("sk-", ALNUM, 48), ("sk-proj-", URLSAFE, 40), ("sk-svcacct-", URLSAFE, 40),
                       ("sk-admin-", URLSAFE, 40)],
    "stripe_api_key": [("sk_live_", ALNUM, 10), ("sk_test_", ALNUM, 10), ("rk_live_", ALNUM, 10),
                       ("rk_test_", ALNUM, 10)],
    "google_api_key": [("AIza", URLSAFE, 35)],
    "gitlab_token": [("glpat-", URLSAFE, 20)],
    "github_fine_grained_token": [("github_pat_", ALNUM + "_", 22)],
    "slack_token": [(f"xox{c}-", ALNUM + "-", 10) for c in "baprs"],
}
CASES = [(kind, prefix, alphabet, n) for kind, formats in FORMATS.items() for prefix, alphabet, n in formats]
IDS = [f"{kind}:{prefix}" for kind, prefix, _a, _n in CASES]


@pytest.mark.parametrize("kind,prefix,alphabet,length", CASES, ids=IDS)
def test_a_key_at_its_documented_length_is_found(kind, prefix, alphabet, length):
    for seed in range(20):
        key = prefix + body(alphabet, length, seed)
        assert pattern_secret_kind(key) == kind, key
        assert value_secret_kind(key) == kind
        assert value_secret_kind(f"export KEY={key} # pasted") == kind
        assert scan({"note": key}) == [SecretFinding("note", kind)]


@pytest.mark.parametrize("kind,prefix,alphabet,length", CASES, ids=IDS)
def test_a_longer_key_is_found_too(kind, prefix, alphabet, length):
    assert pattern_secret_kind(prefix + body(alphabet, length + 60, 1)) == kind


@pytest.mark.parametrize("kind,prefix,alphabet,length", CASES, ids=IDS)
def test_one_character_short_matches_no_format(kind, prefix, alphabet, length):
    for seed in range(20):
        key = prefix + body(alphabet, length - 1, seed)
        assert pattern_secret_kind(key) is None, key
        assert pattern_secret_kind(key + " and more") is None
    # A low-entropy fill is not flagged by the entropy rule either: nothing at all is found.
    assert value_secret_kind(prefix + "a" * (length - 1)) is None
    assert value_secret_kind(prefix + "a" * length) == kind


@pytest.mark.parametrize(
    "value",
    ["sx-" + "a" * 48, "sk_" + "a" * 48, "sk-proj_" + "a" * 40, "sk-prod-" + "a" * 40,  # OpenAI
     "pk_live_" + "a" * 10, "pk_test_" + "a" * 10, "sk_prod_" + "a" * 10, "sk-live-" + "a" * 10,  # Stripe
     "Aiza" + "a" * 35, "AIZA" + "a" * 35, "AIzb" + "a" * 35,  # Google
     "glpat_" + "a" * 20, "glpet-" + "a" * 20, "GLPAT-" + "a" * 20,  # GitLab
     "github-pat_" + "a" * 22, "xoxz-" + "1" * 10],
)
def test_a_wrong_prefix_matches_no_format(value):
    assert pattern_secret_kind(value) is None
    assert value_secret_kind(value) is None


@pytest.mark.parametrize(
    "value,kind",
    [("sk-" + "a" * 48, "openai_api_key"), ("sk_live_" + "a" * 10, "stripe_api_key"),
     ("AIza" + "a" * 35, "google_api_key"), ("glpat-" + "a" * 20, "gitlab_token")],
)
def test_glued_after_a_letter_or_digit_is_a_word_not_a_key_but_after_punctuation_it_is_one(value, kind):
    for glue in ("a", "Z", "7"):
        assert pattern_secret_kind(glue + value) is None
    for glue in ("_", "-", "=", ":", "/", " ", '"', "("):
        assert pattern_secret_kind("NAME" + glue + value) == kind


def test_words_that_merely_contain_the_prefixes_are_not_keys():
    for value in ("tasks-and-more-tasks-" * 4, "desk_live_schedule", "risk_test_matrix_v2", "disk-usage-report",
                  "ask-me-anything", "AIzawa-san", "glpat-short"):
        assert value_secret_kind(value) is None, value


def test_the_first_format_in_order_wins_and_a_format_beats_the_entropy_rule():
    stripe = "sk_live_" + body(ALNUM, 32, 3)
    assert value_secret_kind(stripe) == "stripe_api_key"  # its 40 characters are high entropy too
    assert value_secret_kind("AKIAIOSFODNN7EXAMPLE " + stripe) == "aws_access_key_id"


@pytest.mark.parametrize("kind,prefix,alphabet,length", CASES, ids=IDS)
def test_a_run_log_line_never_carries_the_key(kind, prefix, alphabet, length):
    key = prefix + body(alphabet, length, 7)
    assert redact(f"connecting with {key} now") == f"connecting with {REDACTED} now"


@pytest.mark.parametrize("kind,prefix,alphabet,length", CASES, ids=IDS)
def test_an_idempotency_key_that_embeds_a_provider_key_is_refused(kind, prefix, alphabet, length):
    key = prefix + body(alphabet.replace("-", "").replace("_", ""), length, 9)
    for candidate in (key, "run-" + key, "run:" + key + ":1"):
        with pytest.raises(ItoError) as info:
            validate_key(candidate)
        assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_INVALID
        assert "looks like a secret" in info.value.message and key not in info.value.message


@pytest.mark.parametrize("role", ["desk", "account"])
def test_an_idempotency_key_that_embeds_this_apis_own_token_is_refused(role):
    # A key is echoed in every answer, the audit trail and the Dagster run's tags.
    token = new_token(role)
    for candidate in ("k." + token, "x:" + token, "_" + token, "run-" + token + ":1"):
        with pytest.raises(ItoError) as info:
            validate_key(candidate)
        assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_INVALID and token not in info.value.message
    assert redact(f"retrying with {token}") == f"retrying with {REDACTED}"
    with pytest.raises(ItoError):  # one character short still gives the token away to a few guesses
        validate_key("k.ito_acct_" + token[9:-1])


# --- random idempotency keys: never mistaken for secrets ---------------------------------------

def token_urlsafe(raw: bytes) -> str:
    """secrets.token_urlsafe(len(raw)) itself, fed these bytes instead of os.urandom's."""
    with mock.patch.object(stdlib_secrets, "token_bytes", lambda n: raw[:n]):
        return stdlib_secrets.token_urlsafe(len(raw))


def assert_accepted_or_refused_for_form_only(key: str) -> None:
    # Every token_urlsafe key is accepted, those that start with "-" or "_" (one in 32) included,
    # but one holding "cfr_" (this API's confirmation references; about once in a million).
    assert validate_key(key) == key


def test_token_urlsafe_has_the_lengths_the_key_form_allows():
    assert len(token_urlsafe(bytes(6))) == 8 and len(token_urlsafe(bytes(96))) == 128
    assert len(token_urlsafe(bytes(16))) == 22 and len(token_urlsafe(bytes(32))) == 43
    # one byte past either end no longer fits 8-128 characters
    for raw in (bytes(5), bytes(97)):
        with pytest.raises(ItoError):
            validate_key("k" + token_urlsafe(raw)[1:])


@settings(max_examples=600, derandomize=True, deadline=None)
@given(raw=st.integers(6, 96).flatmap(lambda n: st.binary(min_size=n, max_size=n)))
def test_any_token_urlsafe_key_is_accepted(raw):
    assert_accepted_or_refused_for_form_only(token_urlsafe(raw))


@pytest.mark.parametrize("seed", range(12))
def test_token_urlsafe_keys_of_every_length_from_tested_seeds(seed):
    rng = random.Random(seed)
    flagged_before = 0
    for nbytes in range(6, 97):
        key = token_urlsafe(rng.randbytes(nbytes))
        assert_accepted_or_refused_for_form_only(key)
        flagged_before += value_secret_kind(key) is not None
    # The entropy rule, which validate_key used to apply, refuses many of these very keys.
    assert flagged_before >= 40


@pytest.mark.parametrize("nbytes", [16, 32])
def test_128_and_256_bit_keys_from_tested_seeds(nbytes):
    rng = random.Random(nbytes)
    keys = [token_urlsafe(rng.randbytes(nbytes)) for _ in range(2000)]
    for key in keys:
        assert_accepted_or_refused_for_form_only(key)
    if nbytes == 32:
        assert sum(value_secret_kind(k) == "high_entropy_string" for k in keys) > 1500
