"""Hostile manifests: credentials where the scan must still look, inputs built to make the scan
slow, and refusals that must not echo what they refuse."""

from __future__ import annotations

import time

import pytest

from helpers import valid_manifest, write_manifest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.secrets import value_secret_kind
from ito_assets.manifest.verify import verify_manifest


def _refusal(tmp_path, document) -> ItoError:
    with pytest.raises(ItoError) as info:
        verify_manifest(write_manifest(tmp_path / "m.json", document))
    return info.value


# --- the scan's time is linear in the value's length ----------------------------------------------

# Each was quadratic (a regex restarting at every letter of one long word): 60,000 characters
# took seconds, a 256 KiB manifest minutes.
SLOW_BEFORE = {
    "letters": "a" * 60_000,
    "scheme-like word": "ghp_" + "a" * 60_000,
    "jwt-like run": "eyJ-" * 15_000,
    "jwt-like run with a dot": "eyJa.eyJ-" + "eyJ-" * 15_000,
}


# A URL's password may hold "/": read without a bound, each "://" of a run of them would be read
# to the run's end.
SLOW_BEFORE |= {
    "run of userinfo starts": "://a:" * 12_000,
    "run of userinfo starts with slashes": "://a:/" * 10_000,
    "run of URLs with a port": "a://b:1/" * 7_500,
    "one long password": "://a:" + "b/" * 30_000,
}


@pytest.mark.parametrize("value", SLOW_BEFORE.values(), ids=SLOW_BEFORE.keys())
def test_one_long_word_is_scanned_quickly(value):
    started = time.perf_counter()
    value_secret_kind(value)
    assert time.perf_counter() - started < 1.0


def test_a_long_word_in_a_manifest_is_judged_quickly(tmp_path):
    document = valid_manifest()
    document["model"]["surprise"] = "a" * 100_000
    started = time.perf_counter()
    assert _refusal(tmp_path, document).code is ErrorCode.MANIFEST_INVALID
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("value", [
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJl",
    "Bearer-eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJl",
    "a.eyJabcde.eyJabcde.abcde",  # a JWT right after another dotted segment
    "x eyJabcde.eyJabcde.abcde y",
])
def test_jwts_are_still_found(value):
    assert value_secret_kind(value) == "jwt"


@pytest.mark.parametrize("value", ["xeyJabcde.eyJabcde.abcde", "eyJabcde.eyJabcde-x.abcd", "eyJabcde..eyJabcde.abcde"])
def test_jwt_near_misses(value):
    assert value_secret_kind(value) is None


# --- credentials in a URI's query string -------------------------------------------------------

QUERY_SECRETS = {
    "token": "file:///data/x.jsonl?token=s3cr3tvalue",
    "azure sas": "file:///data/x.jsonl?sv=2022-11-02&sig=Ab%2Bcd%2FEfGh1234%3D",
    "aws presigned": "file:///data/x.jsonl?X-Amz-Signature=0123456789abcdef",
    "aws session": "file:///data/x.jsonl?X-Amz-Security-Token=FwoGZXIvYXdzEJr",
    "api key": "tenant://checkpoints/run?api_key=abcdef123456",
    "password": "tenant://checkpoints/run?user=ito;password=hunter2",
    "access token": "dataroot://corpora/x.jsonl?a=1&access_token=abcd1234",
}


@pytest.mark.parametrize("uri", QUERY_SECRETS.values(), ids=QUERY_SECRETS.keys())
def test_a_credential_in_a_query_string_is_refused_without_echo(tmp_path, uri):
    document = valid_manifest()
    if uri.startswith("tenant://"):
        document["checkpoint_policy"]["storage_uri"] = uri
    else:
        document["data"][0]["uri"] = uri
    error = _refusal(tmp_path, document)
    assert error.code is ErrorCode.MANIFEST_CONTAINS_SECRET
    assert "(url_credentials)" in error.message
    secret = uri.rsplit("=", 1)[1]
    assert secret[:4] not in error.message


# --- a password in a URL's userinfo, "/" included ------------------------------------------------

SLASH_PASSWORD = "q8Rz/Tn4+Wm2Lk9Xv3Bd"  # as `openssl rand -base64 15` prints one


@pytest.mark.parametrize("url", [f"postgresql://ito:{SLASH_PASSWORD}@db.internal:5432/ito",
                                 f"postgresql://ito:{SLASH_PASSWORD}@db/ito", "redis://:a/b@redis:6379/0",
                                 "https://u:pass/word@host", "https://u:a/b/c@host:8443/path"])
def test_a_url_password_with_a_slash_is_a_credential(url):
    assert value_secret_kind(url) == "url_credentials"


# A password that begins as a port would: digits, then "/" (base64 ones do, about once in 400).
PORT_LIKE_PASSWORD = "80/Xq3+Tn4Wm2Lk9Xv"


@pytest.mark.parametrize("url", [f"postgresql://app:{PORT_LIKE_PASSWORD}@db:5432/x", "mysql://root:1234/5678@h/db",
                                 "redis://:9/zz@redis:6379/0", "amqp://guest:5/a?b@broker", "mongodb+srv://u:1#x@h",
                                 f"dsn=postgresql://app:{PORT_LIKE_PASSWORD}@db", f"x{'y' * 40}postgresql://a:1/b@c"])
def test_a_password_that_begins_like_a_port_is_a_credential_outside_the_web(url):
    assert value_secret_kind(url) == "url_credentials"


@pytest.mark.parametrize("url", ["http://db:80/a@b", "HTTPS://host:443/@user/post", "wss://h:8/x@y",
                                 "see:https://h:8443/@me", "(http://h:1/a@b)"])
def test_on_the_web_a_port_and_a_path_with_an_at_sign_stay_a_url(url):
    assert value_secret_kind(url) is None


def test_a_port_like_password_in_a_log_line_is_hidden():
    from ito_assets.control.telemetry import redact

    line = f"could not connect to postgresql://app:{PORT_LIKE_PASSWORD}@db:5432/ito: timeout"
    assert PORT_LIKE_PASSWORD not in redact(line) and "Xq3" not in redact(line)


def test_a_url_password_with_a_slash_in_a_manifest_is_refused_as_a_secret(tmp_path):
    document = valid_manifest()
    document["data"][0]["uri"] = f"postgresql://ito:{SLASH_PASSWORD}@db.internal:5432/ito"
    error = _refusal(tmp_path, document)
    assert error.code is ErrorCode.MANIFEST_CONTAINS_SECRET and "(url_credentials)" in error.message
    assert SLASH_PASSWORD[:4] not in error.message


@pytest.mark.parametrize("text", [
    "http://host:8080/path@x", "https://host:443/users/@me", "http://host:1/a@b", "http://host:65535/a@b",
    "https://host:8443?email=a@b.org", "https://host:8443#frag@x", "http://[::1]:8080/a@b",
    "scp user@host:/path", "ssh://git@host:22/repo", "https://medium.com/@user/post:1",
    "http://host:8080 then mail x@y", "dataroot://corpora/x:y@z",
    # one URL's end, then an address: a JSON document, a list, markup
    '{"api":"http://127.0.0.1:8000","docs":"https://example.org/guide","contact":"ops@example.org"}',
    "http://localhost:8888,https://github.com/org/repo/issues?assignee=@me",
    "<http://h:8000/docs'><a href='mailto:x@y'>", "`http://h:8000/x` and `a@b`",
])
def test_a_port_and_a_path_holding_an_at_sign_is_no_password(text):
    assert value_secret_kind(text) is None


@pytest.mark.parametrize("value", [
    "file:///data/x.jsonl?format=jsonl&page=2",
    "file:///data/x.jsonl?tokens=1000",
    "file:///data/x.jsonl?token=",
    "file:///data/x.jsonl?max_tokens=5",
    "the run used 1000 tokens; see ?design",
])
def test_ordinary_query_strings_pass(value):
    assert value_secret_kind(value) is None


# --- token formats ---------------------------------------------------------------------------


@pytest.mark.parametrize("token", [
    "xapp-1-A0123ABCDEF-1234567890123-0123456789abcdef0123456789abcdef",  # Slack app-level token
    "xoxe-1-abcdefghij0123456789",  # Slack refresh token
])
def test_slack_app_and_refresh_tokens(token):
    assert value_secret_kind(token) == "slack_token"


# --- key names in refusals ---------------------------------------------------------------------

HOSTILE_KEYS = {
    "newline": "a\nERROR forged line",
    "terminal escape": "\x1b[2J\x1b[31mred",
    "bidi override": "\u202eevil",
    "space": "two words",
    "huge": "k" * 100_000,
}


@pytest.mark.parametrize("key", HOSTILE_KEYS.values(), ids=HOSTILE_KEYS.keys())
def test_an_unknown_key_is_not_echoed_unless_plain(tmp_path, key):
    document = valid_manifest()
    document["model"][key] = 1
    error = _refusal(tmp_path, document)
    assert error.code is ErrorCode.MANIFEST_INVALID
    assert error.message == "the manifest does not match the schema at: model.<unknown key>"


@pytest.mark.parametrize("key", ["Tr0ub4dor&3_password", "hunter2-token", "PGPASSWORD_s3cr3t", "hf_token",
                                 "API_________KEY", "Client.Secret"])
def test_a_key_that_names_a_credential_is_hidden_unless_it_is_only_its_name(tmp_path, key):
    document = valid_manifest()
    document["model"][key] = "x"
    error = _refusal(tmp_path, document)
    assert error.message == "the manifest contains secret material at: model.<key> (credential_key_name)"
    document["model"] = {"apiKey": "x"}
    assert _refusal(tmp_path, document).message == ("the manifest contains secret material at: model.apiKey "
                                                    "(credential_key_name)")


@pytest.mark.parametrize("key", HOSTILE_KEYS.values(), ids=HOSTILE_KEYS.keys())
def test_a_secret_below_a_hostile_key_is_located_without_it(tmp_path, key):
    document = valid_manifest()
    document["model"][key] = {"password": "x"}
    error = _refusal(tmp_path, document)
    assert error.code is ErrorCode.MANIFEST_CONTAINS_SECRET
    assert error.message == "the manifest contains secret material at: model.<key>.password (credential_key_name)"


@pytest.mark.parametrize("key", ["surprise", "hunter2", "Tr0ub4dor&3", "x"])
def test_a_plain_unknown_key_is_hidden_too(tmp_path, key):
    # However short and plain, an unknown key is the caller's text: it may be a password pasted
    # as a key.
    document = valid_manifest()
    document["model"][key] = 1
    assert _refusal(tmp_path, document).message == "the manifest does not match the schema at: model.<unknown key>"


@pytest.mark.parametrize(("block", "key", "shown"), [
    ("model", "num_paramters", "model.num_paramters (unknown key; did you mean num_parameters?)"),
    ("model", "sizes", "model.sizes (unknown key; did you mean size?)"),
    (None, "budgett", "budgett (unknown key; did you mean budget?)"),
    # a word of the schema, or near one, that the block does not have: named, nothing suggested
    ("model", "learning_rate", "model.learning_rate (unknown key)"),
    ("model", "lerning_rate", "model.lerning_rate (unknown key)"),
    # the caller's capitals are the caller's text: hidden, the schema's spelling suggested
    ("model", "SIZE", "model.<unknown key> (did you mean size?)"),
    ("budget", "MaX_InCrEmEnTaL_CeNtS", "budget.<unknown key> (did you mean max_incremental_cents?)"),
])
def test_a_typo_of_a_field_is_named_with_the_field_it_missed(tmp_path, block, key, shown):
    document = valid_manifest()
    (document[block] if block else document)[key] = 1
    assert _refusal(tmp_path, document).message == f"the manifest does not match the schema at: {shown}"


@pytest.mark.parametrize(("key", "shown"), [
    ("revisionqq", True),  # two letters added to "revision": the bound itself
    ("rvisionq", True),  # one dropped, one added
    ("revisionqqq", False),  # three: a key shown holds at most two characters of the caller's
    ("num_parametersHUNTER", False),
])
def test_a_near_miss_is_shown_from_the_ratio_bound_on(tmp_path, key, shown):
    document = valid_manifest()
    document["model"][key] = 1
    expected = f"model.{key} (unknown key; did you mean revision?)" if shown else "model.<unknown key>"
    assert _refusal(tmp_path, document).message == f"the manifest does not match the schema at: {expected}"


# --- a credential written into the manifest's prose -----------------------------------------------


def _accepted_because(reason: str) -> dict:
    document = valid_manifest()
    document["data_decision"] = {"accepted_verdicts": ["NO_GO"], "reason": reason, "reviewed_by": "board"}
    return document


@pytest.mark.parametrize("reason", [
    "accepted by the board; the bucket password is Hunter2-canary",
    "see config: PGPASSWORD=hunter2canary",
    'approved, {"api_key": "canary 42"}',
    "kept the vendor's <password>Canary42</password> out of the logs",
])
def test_a_credential_in_the_accepted_verdicts_reason_is_refused_unseen(tmp_path, reason):
    error = _refusal(tmp_path, _accepted_because(reason))
    assert error.code is ErrorCode.MANIFEST_CONTAINS_SECRET
    assert error.message == "the manifest contains secret material at: data_decision.reason (assigned_credential)"
    assert "anary" not in error.message and "unter" not in error.message


@pytest.mark.parametrize("reason", [
    "licence review done; the token budget=512 per doc; the password is required",
    "Decided at review session: 2024-05-01, gain within seed noise",
    "cost per token: 0.3 microcents; auth: board",
    "PII/credentials: scrubbed with detect-secrets; Secrets: 0 found; password: n/a (public data)",
    "token: 2.6B of 270B; the new BPE token is 'Hello'; The eval token = 128009; session cookie: stripped",
    "The <secret>ingredient</secret> is love; the <password>0</password> element is empty",
])
def test_a_reason_that_speaks_of_credentials_without_one_is_accepted(tmp_path, reason):
    verified = verify_manifest(write_manifest(tmp_path / "m.json", _accepted_because(reason)))
    assert verified.manifest.data_decision.reason == reason
