"""A bad ITO_ setting as a caller meets it: each verb that reads the variable answers USAGE_ERROR
(exit 2) naming the variable and never the value, not an internal error; and `ito serve` with a
ledger it cannot open says so in the same way, without the URL or the driver's words."""

from __future__ import annotations

import os

import pytest

from ito_assets.api import cli, server

CANARY = "canary-7f3e"  # planted in each bad value: no part of an answer may repeat it
DIGEST = "sha256:" + "0" * 64

# (variable, a bad value holding the canary where the value can hold one, what the message says)
PIPELINE = [
    ("ITO_MAX_MANIFEST_BYTES", "0", "ITO_MAX_MANIFEST_BYTES must be a positive integer"),
    ("ITO_MAX_MANIFEST_BYTES", CANARY, "ITO_MAX_MANIFEST_BYTES must be a positive integer"),
    ("ITO_EXECUTOR", CANARY, "ITO_EXECUTOR must be one of multiprocess, in_process, k8s"),
    ("ITO_DATA_ENGINE", CANARY, "ITO_DATA_ENGINE must be one of local, ray"),
    ("ITO_DECISION_TRAINER", CANARY, "ITO_DECISION_TRAINER must be one of stage_worker, in_process"),
    ("ITO_DECISION_CONFIG", f'["{CANARY}"]', "ITO_DECISION_CONFIG must be a JSON object"),
    ("ITO_DECISION_CONFIG", f"{{{CANARY}", "ITO_DECISION_CONFIG must be a JSON object"),
]
LOCK = "ITO_LEDGER_LOCK_TIMEOUT_S must be a number of seconds above 0 and at most 3600"
SERVER = [
    ("ITO_CONFIRMATION_TTL_S", "-5", "ITO_CONFIRMATION_TTL_S must be a positive integer"),
    ("ITO_CONFIRMATION_TTL_S", CANARY, "ITO_CONFIRMATION_TTL_S must be a positive integer"),
    ("ITO_MAX_CONCURRENT_RUNS_PER_BOOKING", "0", "ITO_MAX_CONCURRENT_RUNS_PER_BOOKING must be a positive integer"),
    ("ITO_ALLOWED_DATA_ROOTS", os.pathsep, "ITO_ALLOWED_DATA_ROOTS must name at least one folder"),
    ("ITO_LEDGER_LOCK_TIMEOUT_S", "nan", LOCK),
    ("ITO_LEDGER_LOCK_TIMEOUT_S", "inf", LOCK),
    ("ITO_LEDGER_LOCK_TIMEOUT_S", "0", LOCK),
    ("ITO_LEDGER_LOCK_TIMEOUT_S", CANARY, LOCK),
]


@pytest.fixture
def environment(monkeypatch, tmp_path):
    """Only this test's ITO_ variables: a state folder of its own, nothing from the caller's shell.
    A server that got as far as its socket took a value it should have refused: it fails the test
    there rather than serving until the test times out."""
    for name in [n for n in os.environ if n.startswith("ITO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path / "state"))

    def bind(_config):
        raise AssertionError("ito serve went on to bind its socket")

    monkeypatch.setattr(server, "bind", bind)
    return monkeypatch


def _refusal(argv: list[str]) -> dict:
    document, status = cli.run(argv)
    assert status == 2 and document["ok"] is False and document["live_api_contacted"] is False
    assert CANARY not in str(document)
    return document["error"]


@pytest.mark.parametrize("variable, value, message", PIPELINE)
@pytest.mark.parametrize("verb", [["manifest", "verify"], ["audit", "manifest", DIGEST]], ids=["verify", "audit"])
def test_a_bad_pipeline_setting_is_a_usage_error_naming_the_variable(environment, manifest_path, verb, variable,
                                                                     value, message):
    environment.setenv(variable, value)
    argv = [*verb, manifest_path, "--json"] if verb[0] == "manifest" else [*verb, "--json"]
    assert _refusal(argv) == {"code": "USAGE_ERROR", "message": message, "retryable": False}


@pytest.mark.parametrize("variable, value, message", PIPELINE + SERVER)
def test_a_bad_setting_stops_serve_with_a_usage_error_naming_the_variable(environment, variable, value, message):
    environment.setenv(variable, value)
    assert _refusal(["serve", "--port", "0", "--json"]) == {"code": "USAGE_ERROR", "message": message,
                                                            "retryable": False}


URL_HINT = "check the URL, and that its database is up and reachable"
LEDGERS = [
    # down (nothing listens on port 1), a misspelt scheme, a port that is no number, a folder that cannot be made
    (f"postgresql://ito:{CANARY}@127.0.0.1:1/ledger", "OperationalError"),
    (f"postgresq://ito:{CANARY}@127.0.0.1/ledger", "NoSuchModuleError"),
    (f"postgresql://ito:{CANARY}@127.0.0.1:{CANARY}/ledger", "ValueError"),
    (f"not a url {CANARY}", "ArgumentError"),
    (f"sqlite:////proc/{CANARY}/ledger.db", "FileNotFoundError"),
]


@pytest.mark.parametrize("url, error", LEDGERS)
def test_serve_with_a_ledger_it_cannot_open_names_the_variable(environment, url, error):
    environment.setenv("ITO_LEDGER_URL", url)
    assert _refusal(["serve", "--port", "0", "--json"]) == {
        "code": "USAGE_ERROR", "message": f"the ledger ITO_LEDGER_URL names cannot be opened ({error}): {URL_HINT}",
        "retryable": False}


@pytest.mark.parametrize("kind", ["no database", "a folder", "in memory", "no file"])
def test_serve_with_a_sqlite_ledger_that_is_no_database_file_names_the_variable(environment, tmp_path, kind):
    # The file is prepared with sqlite3 before SQLAlchemy opens it: its errors were not caught.
    ledger = tmp_path / "ledger.db"
    if kind == "no database":
        ledger.write_bytes(b"not a database " * 100)
    elif kind == "a folder":
        ledger.mkdir()
    url = {"in memory": "sqlite:///:memory:", "no file": "sqlite://"}.get(kind, f"sqlite:///{ledger}")
    environment.setenv("ITO_LEDGER_URL", url)
    error = _refusal(["serve", "--port", "0", "--json"])
    assert error["code"] == "USAGE_ERROR" and error["message"].startswith("the ledger ITO_LEDGER_URL names ")
    assert str(tmp_path) not in error["message"]


def test_serve_with_a_state_folder_it_cannot_make_names_the_variable(environment):
    environment.setenv("ITO_STATE_DIR", f"/proc/{CANARY}")
    error = _refusal(["serve", "--port", "0", "--json"])
    assert error["code"] == "USAGE_ERROR"
    assert error["message"].startswith("the ledger under ITO_STATE_DIR cannot be opened (")


def test_serve_with_a_ledger_schema_that_is_no_identifier_names_the_variable(environment):
    # Refused before any connection: the URL's database need not exist.
    environment.setenv("ITO_LEDGER_URL", f"postgresql://ito:{CANARY}@127.0.0.1:1/ledger")
    environment.setenv("ITO_LEDGER_SCHEMA", f"Ledger-{CANARY}")
    assert _refusal(["serve", "--port", "0", "--json"]) == {
        "code": "USAGE_ERROR",
        "message": "ITO_LEDGER_SCHEMA must be a lower-case SQL identifier of at most 63 characters", "retryable": False}
