"""ito_assets.manifest.secrets at its boundaries: the exact kind of every token format, a near miss
of each that is not flagged, the entropy rule pinned at its threshold and at the alphabets users
meet, key names, and the locations `scan` reports (never the value)."""

from __future__ import annotations

import math
import random
import string

import pytest

from ito_assets.manifest import secrets
from ito_assets.manifest.secrets import SecretFinding, key_looks_secret, scan, value_secret_kind

# --- the entropy rule on random tokens ----------------------------------------------------------

HEX_LOWER = "0123456789abcdef"
HEX_UPPER = "0123456789ABCDEF"
HEX_MIXED = "0123456789abcdefABCDEF"
BASE62 = string.ascii_letters + string.digits
BASE64 = BASE62 + "+/"
BASE64_URL = BASE62 + "-_"


def _random_tokens(alphabet: str, length: int, seed: int, count: int = 200) -> list[str]:
    rng = random.Random(seed)  # an int seed: the same tokens on every Python and every run
    return ["".join(rng.choice(alphabet) for _ in range(length)) for _ in range(count)]


def _num_flagged(tokens: list[str]) -> int:
    return sum(value_secret_kind(t) is not None for t in tokens)


# (alphabet, length, seed) -> how many of 200 tokens are flagged today. Random base62/base64 at 32
# chars sit around 4.2-4.9 bits/char, so a few draws land under 4.2 bits; hex has at most 16
# symbols (4.0 bits), and one case of it has no upper (or no lower) case letter at all.
RANDOM_CASES = {
    "hex-lower-32": (HEX_LOWER, 32, 1, 0),
    "hex-upper-32": (HEX_UPPER, 32, 2, 0),
    "hex-lower-64": (HEX_LOWER, 64, 3, 0),
    "hex-mixed-32": (HEX_MIXED, 32, 4, 1),  # log2(22) = 4.46 bits at most: only a lucky draw passes
    "base62-32": (BASE62, 32, 5, 195),
    "base62-40": (BASE62, 40, 6, 200),
    "base64-32": (BASE64, 32, 7, 198),
    "base64url-32": (BASE64_URL, 32, 8, 196),
    "base64-40": (BASE64, 40, 9, 200),
    "base64url-40": (BASE64_URL, 40, 10, 199),
}


@pytest.mark.parametrize("case", sorted(RANDOM_CASES))
def test_random_tokens_are_flagged_exactly_as_today(case):
    alphabet, length, seed, expected = RANDOM_CASES[case]
    tokens = _random_tokens(alphabet, length, seed)
    assert _num_flagged(tokens) == expected
    for token in tokens:
        kind = value_secret_kind(token)
        assert kind in (None, "high_entropy_string")
        mixed = any(c.islower() for c in token) and any(c.isupper() for c in token) and any(c.isdigit() for c in token)
        # Every verdict is the rule itself: flagged exactly when mixed and at 4.2 bits or more.
        assert (kind is not None) == (mixed and secrets._entropy(token) >= 4.2), token


def test_lowercase_hex_is_never_flagged_at_any_length():
    for length in (32, 40, 64, 128):
        assert _num_flagged(_random_tokens(HEX_LOWER, length, length)) == 0


# A URI is judged per path segment: joined, these mixed-case directory names with digits reach a
# token's entropy; apart, no segment is even a candidate.
MIXED_CASE_PATHS = [
    "dataroot://Corpora/Stdlib2026/part-0001.jsonl",
    "dataroot://Corpora/Stdlib2026/Python3Docs/part-0001-of-0128.jsonl",
    "dataroot://Corpora/Stdlib2026/part-0001/Shard17Xy-Qz.jsonl",
    "file:///srv/Data/Corpora2026/StdlibDocs/Part-0001_Split7B.jsonl",
    "see dataroot://Corpora/Stdlib2026/Python3Docs/part-0001-of-0128.jsonl for the split",
]


@pytest.mark.parametrize("value", MIXED_CASE_PATHS)
def test_a_uri_is_judged_per_path_segment(value):
    assert value_secret_kind(value) is None
    assert scan({"uri": value}) == []


def test_the_paths_would_be_flagged_if_judged_as_one_run():
    for value in MIXED_CASE_PATHS[1:4]:
        run = max(secrets._CANDIDATE.findall(value), key=len)
        assert len(run) >= 32 and secrets._entropy(run) >= 4.2, value
        assert secrets._high_entropy(run.strip("/"))  # the same run without a scheme is flagged


def test_a_random_segment_of_a_uri_is_still_flagged():
    token = _random_tokens(BASE62, 40, 16, count=1)[0]
    assert value_secret_kind(token) == "high_entropy_string"
    assert value_secret_kind(f"https://example.invalid/hooks/{token}") == "high_entropy_string"
    assert value_secret_kind(f"dataroot://corpora/{token}/part-0001.jsonl") == "high_entropy_string"
    # 31 characters between slashes are not a candidate, 32 are.
    assert value_secret_kind(f"dataroot://a/{token[:31]}/b") is None
    assert value_secret_kind(f"dataroot://a/{token[:32]}/b") == "high_entropy_string"


def test_a_base64_token_without_a_scheme_keeps_its_slashes():
    token = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example secret key
    assert value_secret_kind(token) == "high_entropy_string"
    # The price of judging URIs per segment: a base64 secret pasted after a scheme is split like a
    # path and its pieces are short (the token formats above still match anywhere).
    assert value_secret_kind("dataroot://" + token) is None


@pytest.mark.parametrize(
    "alphabet", [string.ascii_letters, string.ascii_lowercase + string.digits, string.ascii_uppercase + string.digits],
    ids=["no-digit", "no-upper", "no-lower"],
)
def test_high_entropy_without_all_three_classes_is_not_flagged(alphabet):
    tokens = _random_tokens(alphabet, 40, 11)
    assert sum(secrets._entropy(t) >= 4.2 for t in tokens) >= 190  # entropy alone would flag these
    assert _num_flagged(tokens) == 0


def test_31_chars_are_not_a_candidate_32_are():
    token = _random_tokens(BASE62, 40, 12, count=1)[0]
    assert value_secret_kind(token[:32]) == "high_entropy_string"
    assert value_secret_kind(token[:31]) is None
    # A separator splits the candidate: 31 + 31 characters is two short runs, not one long one.
    assert value_secret_kind(token[:31] + " " + token[:31]) is None
    assert value_secret_kind(token[:31] + "." + token[:31]) is None


def test_a_later_candidate_is_still_checked():
    low = "a" * 40  # a candidate, but one letter class only
    high = _random_tokens(BASE62, 40, 13, count=1)[0]
    assert value_secret_kind(f"{low} {high}") == "high_entropy_string"
    assert value_secret_kind(f"{high} {low}") == "high_entropy_string"


def _token_from_counts(counts: tuple[int, ...]) -> str:
    """A token whose character multiset has exactly these counts (the first three symbols are an
    upper-case letter, a lower-case letter and a digit, so the token always has all three classes)."""
    symbols = "Ab7" + "".join(c for c in BASE62 if c not in "Ab7")
    return "".join(symbols[i] * n for i, n in enumerate(counts))


# The 32-character multisets closest to 4.2 bits on either side (an exhaustive search over the
# partitions of 32; exactly 4.2 bits is impossible for a multiset, so >= and > agree).
JUST_ABOVE = (6, 4, 2) + (1,) * 20  # 4.20282 bits
JUST_BELOW = (5, 4, 2, 2, 2) + (1,) * 17  # 4.19970 bits


def test_threshold_is_pinned_between_the_closest_multisets():
    above, below = _token_from_counts(JUST_ABOVE), _token_from_counts(JUST_BELOW)
    assert len(above) == len(below) == 32
    assert 4.2 < secrets._entropy(above) < 4.203
    assert 4.1996 < secrets._entropy(below) < 4.2
    assert value_secret_kind(above) == "high_entropy_string"
    assert value_secret_kind(below) is None
    # Shuffling the same multiset changes nothing: the rule is about counts, not order.
    rng = random.Random(14)
    for token, kind in ((above, "high_entropy_string"), (below, None)):
        chars = list(token)
        rng.shuffle(chars)
        assert value_secret_kind("".join(chars)) == kind


@pytest.mark.parametrize(
    "token,bits",
    [("ab", 1.0), ("aabb", 1.0), ("abcd", 2.0), ("aaab", 0.8112781244591328), ("a", 0.0),
     ("abcdefgh" * 4, 3.0), (BASE64, 6.0)],
)
def test_entropy_is_shannon_bits_per_character(token, bits):
    assert math.isclose(secrets._entropy(token), bits, abs_tol=1e-12)


@pytest.mark.parametrize(
    "value",
    [
        "dataroot://fixtures/corpora/stdlib_docstrings.jsonl",
        "dataroot://fixtures/posttraining/dpo_pairs.jsonl",
        "file:///srv/data/ito/corpora/2026-11-01/stdlib_docstrings_cleaned_v2_deduplicated.jsonl",
        "tenant://checkpoints/fixture-small-with-a-rather-long-run-name-2026",
        "PSF-only mixture chosen for its licence; a within-noise benefit is accepted.",
        "decontaminated_against_the_fixture_eval_suite_version_two",
        "internationalization_and_localization_configuration",
        "3f786850e387550fdab836ed7e6dc881de23001b",  # a git revision
        "sha256:" + "0123456789abcdef" * 4,
        "0123456789abcdef" * 4,
        "3F786850E387550FDAB836ED7E6DC881DE23001B",  # upper-case hex: no lower case
        "ito-fixture-evals-v1",
        "CC0-1.0",
    ],
)
def test_manifest_words_paths_and_digests_are_not_flagged(value):
    assert value_secret_kind(value) is None
    assert scan({"uri": value}) == []


# --- every token format: the exact kind, and a near miss ---------------------------------------

PEM = "-----BEGIN {} PRIVATE KEY-----\nMIIcanary\n-----END {} PRIVATE KEY-----"

CANARIES = {
    # kind -> values that match it (first in _PATTERNS order wins)
    "aws_access_key_id": ["AKIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE", "ABIAIOSFODNN7EXAMPLE",
                          "ACCAIOSFODNN7EXAMPLE", "AIDAIOSFODNN7EXAMPLE", "AROAIOSFODNN7EXAMPLE"],
    "aws_secret_access_key": ["aws_secret_access_key = " + "abcd" * 10,
                              'AWS_SECRET: "' + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY" + '"'],
    "github_token": [f"gh{c}_" + "a" * 36 for c in "pousr"] + ["ghp_" + "a" * 255],
    "github_fine_grained_token": ["github_pat_" + "a" * 22],
    "hugging_face_token": ["hf_" + "a" * 30],
    "private_key": [PEM.format("RSA", "RSA"), PEM.format("EC", "EC"), "-----BEGIN PRIVATE KEY-----",
                    "-----BEGIN PGP PRIVATE KEY BLOCK-----",
                    # The OpenSSH header also matches the generic PEM pattern, which comes first:
                    # ssh_private_key is never the kind reported (see test_ssh_pattern_is_shadowed).
                    "-----BEGIN OPENSSH PRIVATE KEY-----"],
    "jwt": ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJl", "eyJabcde.eyJabcde.abcde"],
    "bearer_token": ["Authorization: Bearer " + "a" * 16, "bearer " + "a" * 16, "token " + "a" * 16 + "=="],
    "url_credentials": ["https://user:pass@example.invalid/x.jsonl", "postgresql://ito:pw@db:5432/ito"],
    "slack_token": ["xoxb-" + "1" * 10, "xoxp-0000-aaaa-bb"],
    "slack_webhook": ["https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"],
    "openai_api_key": ["sk-" + "a" * 48, "sk-proj-" + "a" * 40, "sk-svcacct-" + "a" * 40, "sk-admin-" + "a" * 40,
                       "OPENAI_API_KEY=sk-" + "a" * 48],
    "stripe_api_key": ["sk_live_" + "a" * 10, "sk_test_" + "a" * 10, "rk_live_" + "a" * 10, "rk_test_" + "a" * 10],
    "google_api_key": ["AIza" + "a" * 35, "key=AIza" + "a" * 35],
    "gitlab_token": ["glpat-" + "a" * 20, "GITLAB_TOKEN_glpat-" + "a" * 20],
    "ito_token": ["ito_acct_" + "a" * 42 + "B", "ito_desk_" + "-" * 42 + "7", "k.ito_acct_" + "a_" * 21 + "Z",
                  "_ito_desk_" + "Q" * 43, "run:ito_acct_" + "9" * 43 + ":1"],
}

NEAR_MISSES = {
    "aws_access_key_id": ["AKIAIOSFODNN7EXAMPL", "AKIAiosfodnn7example", "AKIBIOSFODNN7EXAMPLE",
                          "XAKIAIOSFODNN7EXAMPLE"],
    "aws_secret_access_key": ["aws_key_id = " + ("abcd" * 10)[:39], "aws key " + "abcd" * 10],
    "github_token": ["ghp_" + "a" * 35, "ghx_" + "a" * 36, "ghp-" + "a" * 36],
    "github_fine_grained_token": ["github_pat_" + "a" * 21, "github_pot_" + "a" * 22],
    "hugging_face_token": ["hf_" + "a" * 29, "hf-" + "a" * 30],
    "private_key": ["-----BEGIN PUBLIC KEY-----", "-----BEGIN CERTIFICATE-----",
                    "-----BEGIN rsa PRIVATE KEY-----", "BEGIN RSA PRIVATE KEY"],
    "jwt": ["eyJabcde.eyJabcde.abcd", "eyJabcd.eyJabcde.abcde", "eyXabcde.eyJabcde.abcde"],
    "bearer_token": ["Bearer " + "a" * 15, "token count", "tokens " + "a" * 16],
    "url_credentials": ["https://user@example.invalid/x.jsonl", "https://example.invalid:8443/x.jsonl",
                        "dataroot://fixtures/corpora/a:b.jsonl"],
    "slack_token": ["xoxb-" + "1" * 9, "xoxz-" + "1" * 10],
    "slack_webhook": ["https://hooks.slack.com/services/X00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
                      "https://hooks.slack.com/services/T00000000"],
    "openai_api_key": ["sk-" + "a" * 47, "sx-" + "a" * 48, "task-" + "a" * 48, "sk-proj-" + "a" * 39,
                       "sk-prod-" + "a" * 40],
    "stripe_api_key": ["sk_live_" + "a" * 9, "pk_live_" + "a" * 10, "sk_prod_" + "a" * 10, "desk_live_" + "a" * 10],
    "google_api_key": ["AIza" + "a" * 34, "AIzb" + "a" * 35, "xAIza" + "a" * 35],
    "gitlab_token": ["glpat-" + "a" * 19, "glpat_" + "a" * 20, "xglpat-" + "a" * 20],
    "ito_token": ["ito_acct_" + "a" * 42, "ito_account_" + "a" * 43, "ito_desk-" + "a" * 43, "ito_acct_" + "a." * 22,
                  "ito_acct_usage_by_region_and_month_for_the_billing_x",  # a name: no capital or digit
                  "mosquito_desk_" + "A1" * 21 + "B", "ito_acct_" + "A1" * 22],  # inside a word; 44 characters
}


def test_every_pattern_has_canaries_and_near_misses():
    kinds = {kind for kind, _ in secrets._PATTERNS}
    assert set(CANARIES) == set(NEAR_MISSES) == kinds - {"ssh_private_key"}


@pytest.mark.parametrize("kind,value", [(k, v) for k, vs in CANARIES.items() for v in vs])
def test_canary_reports_its_exact_kind(kind, value):
    assert value_secret_kind(value) == kind
    assert value_secret_kind(f"see {value} here") == kind  # embedded in prose, too


@pytest.mark.parametrize("kind,value", [(k, v) for k, vs in NEAR_MISSES.items() for v in vs])
def test_near_miss_is_not_flagged(kind, value):
    assert value_secret_kind(value) is None, kind


def test_ssh_pattern_is_shadowed_by_the_generic_private_key():
    header = "-----BEGIN OPENSSH PRIVATE KEY-----"
    patterns = dict(secrets._PATTERNS)
    assert patterns["ssh_private_key"].search(header)
    assert patterns["private_key"].search(header)
    assert value_secret_kind(header) == "private_key"


def test_first_matching_pattern_wins():
    both = "AKIAIOSFODNN7EXAMPLE " + "ghp_" + "a" * 36
    assert value_secret_kind(both) == "aws_access_key_id"
    assert value_secret_kind("ghp_" + "a" * 36 + " AKIAIOSFODNN7EXAMPLE") == "aws_access_key_id"


def test_a_pattern_beats_the_entropy_rule():
    token = _random_tokens(BASE62, 36, 15, count=1)[0]
    assert value_secret_kind(token) == "high_entropy_string"
    assert value_secret_kind("ghp_" + token) == "github_token"


# --- key names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["password", "passwd", "pwd", "secret", "secrets", "credential", "credentials", "apikey", "token",
     "authorization", "auth", "privatekey", "passphrase", "cookie", "session",
     "DB_PASSWORD", "hf_token", "HF_TOKEN", "hfToken", "session-id", "x.auth.mode", "userPwd",
     # pairs whose words are harmless alone
     "api_key", "apiKey", "API-KEY", "access_key", "accessKey", "private_key", "privateKey", "ssh_key",
     "sshKey", "openai_api_key", "my_ssh_key_path", "OPENAI_API_KEY"],
)
def test_secret_key_names(key):
    assert key_looks_secret(key)
    assert scan({key: "x"}) == [SecretFinding(key, "credential_key_name")]


@pytest.mark.parametrize(
    "key",
    ["num_tokens", "tokenizer", "max_tokens", "tokens", "author", "authority", "keep_last", "sha256",
     "eval_suite_sha256", "storage_uri", "max_incremental_cents", "key", "api", "keyboard", "key_api",
     "api_name", "access_log", "ssh_port", "primary_key", "monkey", "sessions_per_day",
     "api__name", ""],
)
def test_ordinary_key_names(key):
    assert not key_looks_secret(key)
    assert scan({key: "x"}) == []


@pytest.mark.parametrize(
    "key,words",
    [("apiKey", ["api", "key"]), ("hf_token", ["hf", "token"]), ("db-credentials", ["db", "credentials"]),
     ("x.auth.mode", ["x", "auth", "mode"]), ("v2Token", ["v2", "token"]), ("__a__b__", ["a", "b"]),
     ("ABC", ["abc"]), ("", [])],
)
def test_key_words(key, words):
    assert secrets._key_words(key) == words


def test_pairs_must_be_adjacent():
    assert not key_looks_secret("api_name_key")
    assert key_looks_secret("name_api_key")


# --- scan: exact locations and kinds, never the value --------------------------------------------

GITHUB = "ghp_CANARYcanary0123456789abcdefghijABCD"
HF = "hf_CANARYcanaryCANARYcanaryCANARYcan"
ENTROPY = "Zq8XvK2mP9wL4rT7yB3nJ6hF1dG5sA0cQeRuIoP"


def test_scan_reports_exact_locations_and_kinds_in_walk_order():
    document = {
        "name": "ok",
        "data": [{"uri": "dataroot://x.jsonl"}, {"uri": f"see {GITHUB}", "tags": ["fine", ENTROPY]}],
        "hf_token": HF,
        GITHUB: {"nested": "fine"},
        "model": {"apiKey": "x"},
    }
    findings = scan(document)
    assert findings == [
        SecretFinding("data[1].uri", "github_token"),
        SecretFinding("data[1].tags[1]", "high_entropy_string"),
        SecretFinding("hf_token", "credential_key_name"),
        SecretFinding("hf_token", "hugging_face_token"),
        SecretFinding("<key>", "github_token"),
        SecretFinding("model.apiKey", "credential_key_name"),
    ]
    text = repr(findings) + str(findings)
    for canary in (GITHUB, HF, ENTROPY, "CANARY", "Zq8X"):
        assert canary not in text


def test_a_secret_key_is_hidden_in_every_location_below_it():
    findings = scan({"a": {GITHUB: {"b": [HF]}}})
    assert findings == [SecretFinding("a.<key>", "github_token"), SecretFinding("a.<key>.b[0]", "hugging_face_token")]
    assert GITHUB not in repr(findings)


def test_credential_key_names_are_shown_by_name():
    # A key that merely *names* a credential is not itself a secret: the location shows it.
    assert scan({"outer": {"password": "hunter2"}}) == [SecretFinding("outer.password", "credential_key_name")]


@pytest.mark.parametrize(
    "document,expected",
    [
        (GITHUB, [SecretFinding("<root>", "github_token")]),
        ([GITHUB], [SecretFinding("[0]", "github_token")]),
        ([[1, GITHUB]], [SecretFinding("[0][1]", "github_token")]),
        ({"a": [{"b": GITHUB}]}, [SecretFinding("a[0].b", "github_token")]),
        ({"a": 1, "b": None, "c": 2.5, "d": True, "e": []}, []),
        ("fine", []),
        (3, []),
    ],
)
def test_scan_locations(document, expected):
    assert scan(document) == expected


def test_non_string_values_are_not_scanned_but_their_keys_are():
    assert scan({"token": 12345}) == [SecretFinding("token", "credential_key_name")]
    assert scan({"n": 10**40}) == []


def test_is_exempt_spares_only_the_values_it_names():
    document = {"sha256": ENTROPY, "other": ENTROPY}
    assert scan(document) == [SecretFinding("sha256", "high_entropy_string"), SecretFinding("other", "high_entropy_string")]
    seen = []

    def exempt(path, value):
        seen.append((path, value))
        return path == ("sha256",)

    assert scan(document, is_exempt=exempt) == [SecretFinding("other", "high_entropy_string")]
    assert seen == [(("sha256",), ENTROPY), (("other",), ENTROPY)]  # called for string values only
    # Exempting a value never exempts its key name.
    assert scan({"password": ENTROPY}, is_exempt=lambda p, v: True) == [SecretFinding("password", "credential_key_name")]


def test_scan_never_contains_any_canary_value():
    values = [v for vs in CANARIES.values() for v in vs] + [GITHUB, HF, ENTROPY]
    document = {"values": values, **{f"k{i}": v for i, v in enumerate(values)}}
    findings = scan(document)
    assert len(findings) == 2 * len(values)
    text = repr(findings)
    for value in values:
        assert value not in text


@pytest.mark.parametrize("key", ["XYZ", "Xray", "X.y"])
def test_locations_keep_leading_characters_of_key_names(key):
    assert scan({key: GITHUB}) == [SecretFinding(key, "github_token")]
    assert scan({"a": {key: GITHUB}}) == [SecretFinding(f"a.{key}", "github_token")]


# --- values assigned to a credential's name, in text ---------------------------------------------

ASSIGNED = [
    # (text, the values hidden)
    ("PGPASSWORD=hunter2", ["hunter2"]),
    ("env: HOME=/root DB_PASSWORD=hunter2 PATH=/bin", ["hunter2"]),
    ("export WANDB_API_KEY=" + "0123456789abcdef" * 2 + "01234567",  # lower-case hex: no entropy rule
     ["0123456789abcdef" * 2 + "01234567"]),
    ('{"api_key": "abc 123", "n": 1}', ['"abc 123"']),
    ("password: 'it is me'", ["'it is me'"]),
    ("hf_token := x1", ["x1"]),
    ("secret => s3", ["s3"]),
    ("auth_token=abc==", ["abc=="]),  # base64 padding stays with its value
    ("Authorization: Basic dXNlcjpwYXNz", ["dXNlcjpwYXNz"]),  # the scheme is shown
    ("the password is hunter2", ["hunter2"]),
    ("my passphrase is Correct-Horse", ["Correct-Horse"]),
    ("x=password=abc", ["abc"]),  # a name inside a value
    ('cfg {"x": "password=abc"}', ['abc"}']),  # a name inside a quoted value; to the end of its word
    ("password='unclosed to the end", ["'unclosed to the end"]),
    ("--hf-token=abc123 --db-password hunter2", ["abc123", "hunter2"]),  # flags
    ("API Key: abc123def", ["abc123def"]),  # a two-word label
    ("Command '['psql', '--password', 'hunter2']' failed", ["'hunter2'"]),  # a printed argument list
    ('["--hf-token", "abc123", "--steps", "10"]', ['"abc123"']),
    ("<password>hunter2</password><user>bob</user>", ["hunter2"]),  # an XML element
    ("<Password>two words</Password> <api_key>abc9</api_key>", ["two words", "abc9"]),
    ("<password>password=abc</password>", ["password=abc</password>"]),  # overlapping readings joined
    ('<wsse:Password Type="#PasswordText">hunter2</wsse:Password>', ["hunter2"]),  # a namespace, attributes
    ("<ns:api_key>abc123</ns:api_key>", ["abc123"]),
    ("['x', '--password', b'hunter2']", ["'hunter2'"]),  # bytes in a printed list
    ("mysql -u root -phunter2 db", ["hunter2"]),  # mysql's tools glue the password to -p
    ("Command '['mysqldump', '-uroot', '-pHunter2', 'db']' failed", ["Hunter2"]),
    ("mariadb-dump -h db -ps3cret", ["s3cret"]), ("mysql -pa]b),c db", ["a]b),c"]),  # to the end of its word
    ("sshpass -p hunter2 ssh host", ["hunter2"]), ("sshpass -phunter2 ssh host", ["hunter2"]),
    ("sshpass -p hunter2 ssh -p 2222 host", ["hunter2"]), ("['sshpass', '-p', 'pw1', 'ssh', '-p', '22']", ["'pw1'"]),
    ("redis-cli -h cache -p 6379 -a 'pw 1' ping", ["'pw 1'"]),  # redis-cli's -p is its port
    ("['redis-cli', '-a', 'hunter2']", ["'hunter2'"]),
    ("env:\n- name: HOME\n  value: /root\n- name: DB_PASSWORD\n  value: hunter2\n", ["hunter2"]),  # Kubernetes
    ('"environment": [{"name": "API_KEY", "value": "abc123"}]', ['"abc123"']),  # ECS
    ('{\n  "name": "DB_PASSWORD",\n  "value": "hunter2"\n}', ['"hunter2"']),  # kubectl -o json
    ("machine api.example.com login alice password hunter2", ["hunter2"]),  # .netrc on one line
    ("machine api.example.com\n  login alice\n  password hunter2\n", ["hunter2"]),  # and on its own
    ("default login anonymous password pw1", ["pw1"]),
    ("token=hunter2xyz", ["hunter2xyz"]), ("login ok session=9f2c81ab", ["9f2c81ab"]),  # alone, as NAME=value
    ("auth=s3cret", ["s3cret"]), ("--token abc123", ["abc123"]),
]
NOT_ASSIGNED = [
    "token_budget=512",  # the last word names what it is: a budget
    "password_file=/run/secrets/db",  # a path, not the password
    "tokens=5", "num_tokens: 4096", "tokenizer: gpt2", "passwordless=1",
    "the token is invalid", "the password is Expired.",  # prose with a plain word after "is"
    "password isolated", "token is", "password=", "password=[REDACTED]", "password: [hidden]",
    "key_id=12", "api=1 key=2", "session: 3", "auth: ok",  # alone, in text, these name settings
    "pad_token: <pad>", "api_key: None", "--token-file /run/t",
    "token: 50256", "sampled token=50256", "assert api_key == expected",  # a text's token; a comparison
    "['psql', '--password', '-h', 'db']",  # psql's --password takes no value: it asks for one
    "['--steps', '10']",
    "<token>50256</token>", "<pad_token>x</pad_token>", "<password>${DB_PASSWORD}</password>",
    "<password></password>", "<password>x</passwd>", "<password>a\nb</password>",  # no element
    "<password x>y</password >", "<ns:password>x</password>",  # no element either: the end tag differs
    "['psql', '--no-password', 'db']", "--no-auth server", "mysql --no_password db",  # flags that take no value
    "mysql -u root -p db", "mysql -h db -P3306 -p",  # a spaced or bare -p asks for the password
    "ssh -p2222 host", "scp -P 22 -p a b", "rsync -pa src dst",  # -p of other commands is theirs
    "sshpass -f ~/.pw ssh -p 2222 user@host", "['sshpass', '-e', 'ssh', '-p', '22']",  # the wrapped command's port
    "- name: DB_PASSWORD\n  valueFrom:\n    secretKeyRef: {name: db}",  # from a secret: no value here
    "- name: HOME\n  value: /root", "name: token\nvalue: 50256", "username: DB_PASSWORD\nvalue: 3",
    "password required", "password reset for bob",  # a sentence, not a .netrc's password line
    "token=50256", "token=abc", "auth=ok", "session=7", "next_token=a1",  # no letters and digits mixed
    "--no-token abc123", "no_auth=x1",
    "session: abc123", "token = abc123",  # not NAME=value: a setting's, or code's
]


@pytest.mark.parametrize(("text", "hidden"), ASSIGNED)
def test_values_assigned_to_a_credential_name_are_found(text, hidden):
    spans = secrets.assigned_credentials(text)
    assert [text[start:end] for start, end in spans] == hidden
    assert value_secret_kind(text) == "assigned_credential"


@pytest.mark.parametrize(("text", "in_a_log", "in_a_document"), [
    ("PGPASSWORD=hunter", True, True),  # NAME=value is a dump's: its value is literal
    ("password: hunter", True, False),  # after ": " in a document's sentence, a plain word is the sentence's
    ("password = hunter", True, False),
    ("password: n/a", True, False),
    ("Secrets: 0 found", True, False),
    ("password: hunter2", True, True),
    ("the password is hunter", False, False),  # "is": prose in both
])
def test_a_documents_sentence_keeps_its_plain_words_where_a_log_hides_them(text, in_a_log, in_a_document):
    assert bool(secrets.assigned_credentials(text)) is in_a_log
    assert bool(secrets.assigned_credentials(text, prose=True)) is in_a_document
    assert (value_secret_kind(text) == "assigned_credential") is in_a_document


@pytest.mark.parametrize("text", NOT_ASSIGNED)
def test_names_that_hold_no_credential_are_left_alone(text):
    assert secrets.assigned_credentials(text) == []
    assert value_secret_kind(text) is None


def test_a_prose_value_needs_a_digit_a_symbol_or_a_capital_after_the_first():
    assert secrets.assigned_credentials("password is hunter") == []
    assert secrets.assigned_credentials("password is Hunter") == []
    for value in ("hunter2", "hunTer", "hunter!x", "h_unter"):
        assert secrets.assigned_credentials(f"password is {value}") != [], value


@pytest.mark.parametrize("key", ["PGPASSWORD", "MYSQLPWD_TOKEN", "DBSECRET", "MYAPIKEY", "db_password_file"])
def test_glued_credential_names_are_secret_key_names(key):
    assert key_looks_secret(key)


@pytest.mark.parametrize("key", ["TIKTOKEN_CACHE_DIR", "subtoken", "detokenizer"])
def test_a_word_that_only_ends_in_token_names_no_credential(key):
    assert not key_looks_secret(key)


@pytest.mark.parametrize("text", ["password: " + "a" * 262_000, "password: \\'none " * 20_000 + "'x",
                                  "password " + "-a=/" * 65_000, "-u=/" * 65_000, "a=" * 131_072, 'a="' * 87_000, 'a="a"' * 52_000, "a: " * 87_000,
                                  "a is " * 52_000, "password=" * 29_000, "x-" * 131_000 + "=",
                                  "<password>" * 26_000, "<password>a" * 23_000 + "</password>",
                                  "'--password', " * 18_000, "<a>" * 87_000, "<wsse:Password x" * 16_000,
                                  '<password t="' * 20_000, "<ns:" * 65_000,
                                  "mysql " * 43_000, "mysql " + "-p " * 87_000, "sshpass " + "-p " * 87_000,
                                  "name: DB_PASSWORD\n" * 14_000, '"name": "PASSWORD", ' * 13_000,
                                  "machine a " * 26_000, "machine a " + "login b " * 32_000,
                                  "password \n" * 26_000,
                                  # Each value read once: an option's or an entry's search goes on past it.
                                  "name:PASS,value:" * 16_384, "redis-cli " + "-a'" * 87_000,
                                  "sshpass " + "-p'" * 87_000, "default login " * 18_700 + "pass"])
def test_assignments_are_read_in_linear_time(text):
    # A manifest may hold 256 KiB in one value. A quadratic reading of these took 64 s for the
    # first; linear, each takes about a second at most on a slow machine. The bound is generous:
    # it only has to tell the two apart.
    import time

    started = time.perf_counter()
    secrets.assigned_credentials(text)
    assert time.perf_counter() - started < 20


def test_a_key_of_many_words_is_judged_in_linear_time():
    import time

    started = time.perf_counter()
    assert not key_looks_secret("a_" * 131_072)  # no prefix of the words is copied: that would be quadratic
    assert time.perf_counter() - started < 20


def test_an_idempotency_key_may_name_a_session():
    # Keys are random or structured ids, judged by known formats only: "session:2026-12-07" is one.
    from ito_assets.control.fingerprint import validate_key

    assert validate_key("nightly-session:2026-12-07") == "nightly-session:2026-12-07"
