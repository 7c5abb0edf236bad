import pytest

from helpers import CANARIES
from ito_assets.manifest import secrets
from ito_assets.manifest.schema import is_digest_field

# The kind each canary family is reported as.
KINDS = {"aws": "aws_access_key_id", "github": "github_token", "github_fine": "github_fine_grained_token",
         "hugging_face": "hugging_face_token", "pem": "private_key", "jwt": "jwt", "bearer": "bearer_token",
         "url": "url_credentials", "slack": "slack_token", "entropy": "high_entropy_string"}


@pytest.mark.parametrize("name", sorted(CANARIES))
def test_each_canary_family_is_found(name):
    findings = secrets.scan({"note": f"see {CANARIES[name]} here"})
    assert [f.kind for f in findings] == [KINDS[name]], name
    assert all(CANARIES[name] not in f.location for f in findings)


@pytest.mark.parametrize(
    "key", ["password", "hf_token", "apiKey", "aws_secret_access_key", "db-credentials", "client_secret",
            "Authorization", "private_key", "ssh_key", "accessToken"]
)
def test_credential_like_key_names(key):
    assert [f.kind for f in secrets.scan({key: "x"})] == ["credential_key_name"]


@pytest.mark.parametrize(
    "key", ["num_tokens", "tokenizer", "author", "keep_last", "storage_uri", "sha256", "eval_suite_sha256",
            "max_incremental_cents", "license", "revision"]
)
def test_ordinary_key_names_pass(key):
    assert secrets.scan({key: "value"}) == []


@pytest.mark.parametrize(
    "value",
    [
        "dataroot://fixtures/corpora/stdlib_docstrings.jsonl",
        "tenant://checkpoints/fixture-small",
        "3f786850e387550fdab836ed7e6dc881de23001b",  # a git revision
        "The quick brown fox jumps over the lazy dog, repeatedly and at length.",
        "file:///srv/data/corpus-2026-11-01.parquet",
    ],
)
def test_ordinary_values_pass(value):
    assert secrets.scan({"uri": value}) == []


def test_digest_fields_are_exempt_only_in_digest_form():
    digest = "ab" * 32
    assert secrets.scan({"sha256": digest}, is_exempt=is_digest_field) == []
    assert is_digest_field(("data", 0, "sha256"), digest)
    assert not is_digest_field(("data", 0, "uri"), digest)
    assert not is_digest_field(("data", 0, "sha256"), CANARIES["entropy"])
    assert [f.kind for f in secrets.scan({"sha256": CANARIES["entropy"]}, is_exempt=is_digest_field)] == [
        "high_entropy_string"]


def test_secret_in_a_key_name_is_not_echoed():
    findings = secrets.scan({CANARIES["github"]: 1})
    assert [f.kind for f in findings] == ["github_token"]
    assert findings and all(CANARIES["github"] not in f.location for f in findings)
