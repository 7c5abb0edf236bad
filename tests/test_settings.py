"""The one settings model (settings.ItoSettings) and the views built from it: every bounded number
at its bound and one either side, the error each variable gives, and which reader pays for what."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ito_assets import env as env_text
from ito_assets.api import client_config, server
from ito_assets.errors import ItoError
from ito_assets.control.policy import load_policy, policy_from
from ito_assets.settings import ItoSettings, load_settings, settings_from

SECRET = "ito_acct_" + "s" * 43  # a token pasted into the wrong variable must never be echoed


def _usage_error(read, name: str) -> str:
    with pytest.raises(ItoError) as refused:
        read()
    assert refused.value.code.value == "USAGE_ERROR" and name in refused.value.message
    assert SECRET not in refused.value.message
    return refused.value.message


def _refused_as_a_positive_integer(read, name: str) -> None:
    assert _usage_error(read, name) == f"{name} must be a positive integer"


# --- USAGE_ERROR from every view: the pipeline's settings and the gate policy ----------------------
# A verb reports the refusal as it is (exit 2), never as an internal error (tests/test_settings_cli.py).

@pytest.mark.parametrize("value, expected", [(None, 262144), ("1", 1), ("2", 2), ("262144", 262144),
                                             ("0", None), ("", None), ("-1", None), ("1.0", None), (" 1", None),
                                             ("+1", None), ("1_0", None), ("\u0663", None), ("9" * 5000, None),
                                             (SECRET, None)])
def test_max_manifest_bytes_is_a_positive_integer(value, expected) -> None:
    env = {} if value is None else {"ITO_MAX_MANIFEST_BYTES": value}
    if expected is None:
        _refused_as_a_positive_integer(lambda: load_settings(env), "ITO_MAX_MANIFEST_BYTES")
    else:
        assert load_settings(env).max_manifest_bytes == expected


@pytest.mark.parametrize("name, attribute, default", [
    ("ITO_CONFIRMATION_TTL_S", "confirmation_ttl_s", 600),
    ("ITO_MAX_CONCURRENT_RUNS_PER_BOOKING", "max_concurrent_runs_per_booking", 1)])
@pytest.mark.parametrize("value, expected", [(None, "default"), ("1", 1), ("2", 2), ("0", None), ("", None),
                                             ("-1", None), ("\u0663", None), (SECRET, None)])
def test_policy_counts_at_their_bound(tmp_path, name, attribute, default, value, expected) -> None:
    settings = load_settings({"ITO_STATE_DIR": str(tmp_path)})
    env = {} if value is None else {name: value}
    if expected is None:
        _refused_as_a_positive_integer(lambda: load_policy(settings, env), name)
    else:
        assert getattr(load_policy(settings, env), attribute) == (default if expected == "default" else expected)


# --- USAGE_ERROR: `ito serve` and the client -----------------------------------------------------------


@pytest.mark.parametrize("name", ["ITO_CONNECT_TIMEOUT_S", "ITO_TIMEOUT_S"])
@pytest.mark.parametrize("value, expected", [("0", None), ("1e-9", 1e-9), ("0.5", 0.5), ("3599.999", 3599.999),
                                             ("3600", 3600.0), ("3600.001", None), ("-0", None), ("nan", None),
                                             ("inf", None), (SECRET, None)])
def test_client_seconds_at_their_bounds(name, value, expected) -> None:
    attribute = {"ITO_CONNECT_TIMEOUT_S": "connect_timeout_s", "ITO_TIMEOUT_S": "total_timeout_s"}[name]
    if expected is None:
        _usage_error(lambda: client_config.load_client_config({name: value}), name)
    else:
        assert getattr(client_config.load_client_config({name: value}), attribute) == expected


@pytest.mark.parametrize("url, port", [("http://127.0.0.1:1", 1), ("http://127.0.0.1:65535", 65535),
                                       ("http://127.0.0.1", 80), ("https://api.example.org", 443),
                                       ("https://api.example.org/", 443), ("http://[::1]:8765", 8765),
                                       ("http://127.0.0.1:0", None), ("http://127.0.0.1:65536", None),
                                       ("http://127.0.0.1:-1", None), (f"http://127.0.0.1:{SECRET}", None)])
def test_the_api_url_s_port_at_its_bounds(url, port) -> None:
    if port is None:
        assert _usage_error(lambda: client_config.load_client_config({"ITO_API_URL": url}), "ITO_API_URL") \
            == "ITO_API_URL's port must be a number from 1 to 65535"
    else:
        assert client_config.load_client_config({"ITO_API_URL": url}).endpoint.port == port


@pytest.mark.parametrize("url", ["https://api.example.org/v2", "https://api.example.org//", "http://127.0.0.1:8765/ito",
                                 "https://api.example.org?region=eu", "https://api.example.org/#top",
                                 f"https://api.example.org/{SECRET}"])
def test_an_api_url_with_a_path_query_or_fragment_is_refused(url) -> None:
    # The routes are at the API's root: what follows the port would be dropped without a word.
    assert _usage_error(lambda: client_config.load_client_config({"ITO_API_URL": url}), "ITO_API_URL") \
        == "ITO_API_URL must be http(s)://host[:port] with no path, query or fragment"


def test_client_seconds_default_when_unset_or_empty() -> None:
    for env in ({}, {"ITO_CONNECT_TIMEOUT_S": "", "ITO_TIMEOUT_S": ""}):
        config = client_config.load_client_config(env)
        assert (config.connect_timeout_s, config.total_timeout_s) == (3.0, 30.0)


@pytest.mark.parametrize("value, expected", [(None, 30.0), ("", 30.0), ("0.3", 0.3), ("abc", None), (SECRET, None),
                                             ("-1", None), ("0", None), ("-0", None), ("1e-9", 1e-9),
                                             ("3599.999", 3599.999), ("3600", 3600.0), ("3600.001", None),
                                             ("nan", None), ("inf", None), ("1e308", None)])
def test_ledger_lock_timeout(tmp_path, value, expected) -> None:
    """Above 0 (0 or less waits for no lock: every concurrent write fails at once) and at most an
    hour, the longest a client waits for one request; NaN and infinity are refused."""
    env = {"ITO_STATE_DIR": str(tmp_path)} | ({} if value is None else {"ITO_LEDGER_LOCK_TIMEOUT_S": value})
    if expected is None:
        _usage_error(lambda: server.load_config("127.0.0.1", 0, env), "ITO_LEDGER_LOCK_TIMEOUT_S")
    else:
        assert server.load_config("127.0.0.1", 0, env).lock_timeout_s == expected


# --- the one reading ------------------------------------------------------------------------------

def test_only_the_exact_upper_case_names_count(tmp_path) -> None:
    env = {"ito_state_dir": "/lower", "Ito_State_Dir": "/mixed", "ITO_STATE_DIR": str(tmp_path), "XITO_DATA_ROOT": "/x"}
    reading = ItoSettings.read(env)
    assert reading.state_dir == str(tmp_path) and reading.data_root is None
    assert ItoSettings.read({"ito_state_dir": "/lower"}).state_dir is None


def test_a_value_is_text_as_set(tmp_path) -> None:
    # No JSON decoding, no stripping: the views parse every value themselves.
    reading = ItoSettings.read({"ITO_ALLOWED_LICENSES": '["MIT"]', "ITO_LEDGER_SCHEMA": "", "ITO_TIMEOUT_S": " 5 "})
    assert (reading.allowed_licenses, reading.ledger_schema, reading.timeout_s) == ('["MIT"]', "", " 5 ")


def test_the_process_environment_is_the_default(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path))
    assert ItoSettings.read().state_dir == str(tmp_path) == str(load_settings().state_dir)
    assert ItoSettings.read({}).state_dir is None  # a given mapping replaces the environment


def test_every_variable_a_view_reads_is_a_field_of_the_model(tmp_path) -> None:
    fields = set(ItoSettings.model_fields)
    assert set(client_config.FIELDS) <= fields
    assert all(ItoSettings.variable(f).startswith(env_text.PREFIX) for f in fields)
    # Each field changes what some view builds from it.
    values = {"project_root": str(tmp_path), "state_dir": str(tmp_path / "s"), "data_root": str(tmp_path / "d"),
              "manifests_dir": str(tmp_path / "m"), "eval_suite": str(tmp_path / "e"), "max_manifest_bytes": "7",
              "executor": "in_process", "data_engine": "ray", "decision_trainer": "in_process", "decision_config": '{"num_steps": 4}', "ledger_url": "sqlite:///x.db",
              "ledger_schema": "ito", "allowed_data_roots": str(tmp_path / "r"), "allowed_licenses": "MIT", "tenants_root": str(tmp_path / "t"),
              "confirmation_ttl_s": "5", "max_concurrent_runs_per_booking": "4", "ledger_lock_timeout_s": "2",
              "api_read_timeout_s": "3", "api_max_connections_per_client": "9", "api_url": "http://127.0.0.1:1",
              "token_file": "/t", "connect_timeout_s": "6", "timeout_s": "8"}
    assert set(values) == fields
    env = {ItoSettings.variable(f): v for f, v in values.items()}
    default = (settings_from(ItoSettings.read({})), server.load_config("h", 1, {}),
               client_config.load_client_config({}))
    changed = (settings_from(ItoSettings.read(env)), server.load_config("h", 1, env),
               client_config.load_client_config(env))
    policy = policy_from(changed[0], ItoSettings.read(env))
    seen = {**vars(changed[0]), **{f"server.{k}": v for k, v in vars(changed[1]).items()},
            **{f"client.{k}": v for k, v in vars(changed[2]).items()}, **{f"policy.{k}": v for k, v in vars(policy).items()}}
    assert changed[0] != default[0] and changed[1] != default[1] and changed[2] != default[2]
    assert seen["max_manifest_bytes"] == 7 and seen["policy.confirmation_ttl_s"] == 5
    assert seen["decision_trainer"] == "in_process" and seen["decision_config"] == {"num_steps": 4}
    assert (seen["server.lock_timeout_s"], seen["server.read_timeout_s"], seen["server.max_connections_per_client"]) \
        == (2.0, 3.0, 9)
    assert (seen["client.connect_timeout_s"], seen["client.total_timeout_s"], seen["client.token_file"]) == (6.0, 8.0, "/t")


def test_a_bad_value_fails_only_the_views_that_read_it(tmp_path) -> None:
    env = {"ITO_STATE_DIR": str(tmp_path), "ITO_CONFIRMATION_TTL_S": "0", "ITO_API_READ_TIMEOUT_S": "0",
           "ITO_TIMEOUT_S": "0"}
    assert load_settings(env).state_dir == tmp_path  # the pipeline reads none of the three
    _usage_error(lambda: load_policy(load_settings(env), env), "ITO_CONFIRMATION_TTL_S")
    _usage_error(lambda: server.load_config("127.0.0.1", 0, env), "ITO_API_READ_TIMEOUT_S")
    _usage_error(lambda: client_config.load_client_config(env), "ITO_TIMEOUT_S")


def test_the_server_builds_its_policy_from_the_reading_load_config_made(tmp_path) -> None:
    env = {"ITO_STATE_DIR": str(tmp_path), "ITO_CONFIRMATION_TTL_S": "42"}
    config = server.load_config("127.0.0.1", 0, env)
    assert config.environment == ItoSettings.read(env) and config == server.load_config("127.0.0.1", 0, {**env, "X": "1"})
    api = server.open_api(config)  # the process environment is not read again
    try:
        assert api.policy.confirmation_ttl_s == 42 and api.policy.tenants_root == tmp_path / "tenants"
    finally:
        api.ledger.dispose()


def test_the_client_does_not_import_the_settings_model() -> None:
    probe = ("import sys; from ito_assets.api import cli, client_config; "
             "client_config.load_client_config({}); "
             "print(sorted(m for m in ('pydantic', 'pydantic_settings', 'ito_assets.settings') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.stdout.strip() == "[]"


def test_a_printed_settings_object_never_shows_the_ledger_password() -> None:
    env = {"ITO_LEDGER_URL": "postgresql://ito:canary-pw-3f9a@db/ledger"}
    read = ItoSettings.read(env)
    assert read.ledger_url == "postgresql://ito:canary-pw-3f9a@db/ledger"
    assert "canary-pw-3f9a" not in repr(read) and "canary-pw-3f9a" not in str(read)
    # Nor the views built from it: the pipeline's settings and the server's configuration.
    settings, config = load_settings(env), server.load_config("127.0.0.1", 0, env)
    assert settings.ledger_url == config.ledger_url == env["ITO_LEDGER_URL"]
    for view in (settings, config):
        assert "canary-pw-3f9a" not in repr(view) and "canary-pw-3f9a" not in str(view)


# (variable, field, default, the message's list of choices, value, valid): a value not exactly
# one of the choices (another case, empty, another tool's name) is refused with the list.
CHOICES = [("ITO_DATA_ENGINE", "data_engine", "local", "ITO_DATA_ENGINE must be one of local, ray")]
CHOICES += [("ITO_DECISION_TRAINER", "decision_trainer", "stage_worker",
             "ITO_DECISION_TRAINER must be one of stage_worker, in_process")]
CHOICES += [("ITO_EXECUTOR", "executor", "multiprocess", "ITO_EXECUTOR must be one of multiprocess, in_process, k8s")]
CHOICE_VALUES = [(0, None, True), (0, "local", True), (0, "ray", True), (0, "spark", False), (0, "", False), (0, "Ray", False),
                 (1, None, True), (1, "stage_worker", True), (1, "in_process", True), (1, "In_Process", False), (1, "", False),
                 (1, "torchrun", False), (2, None, True), (2, "multiprocess", True), (2, "in_process", True),
                 (2, "k8s", True), (2, "K8s", False), (2, "", False), (2, SECRET, False)]


@pytest.mark.parametrize("setting,value,valid", CHOICE_VALUES)
def test_a_choice_setting_takes_its_values_and_refuses_the_others(setting, value, valid) -> None:
    variable, field, default, message = CHOICES[setting]
    env = {} if value is None else {variable: value}
    if valid:
        assert getattr(load_settings(env), field) == (value or default)
        return
    with pytest.raises(ItoError) as refused:
        load_settings(env)
    assert refused.value.code.value == "USAGE_ERROR" and refused.value.message == message


@pytest.mark.parametrize("value,parsed", [(None, {}), ("", {}), ("{}", {}), ('{"num_steps": 4}', {"num_steps": 4}),
                                          (' {"model_name": "micro", "seeds": [0, 1]} ', {"model_name": "micro", "seeds": [0, 1]})])
def test_the_decision_config_is_a_json_object(value, parsed) -> None:
    env = {} if value is None else {"ITO_DECISION_CONFIG": value}
    assert load_settings(env).decision_config == parsed


@pytest.mark.parametrize("value", ["[1, 2]", '"micro"', "4", "null", "{num_steps: 4}", '{"num_steps": 4', "micro"])
def test_a_decision_config_that_is_not_a_json_object_is_refused(value) -> None:
    with pytest.raises(ItoError) as refused:
        load_settings({"ITO_DECISION_CONFIG": value})
    assert refused.value.code.value == "USAGE_ERROR"
    assert refused.value.message == "ITO_DECISION_CONFIG must be a JSON object"
