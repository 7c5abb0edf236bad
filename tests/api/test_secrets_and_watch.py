"""Canary secrets never reach any output, error or log; a revoked token stops `status --watch`."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from api_harness import ito_subprocess, read_json_line
from helpers import CANARIES, valid_manifest

ENV_CANARIES = {"AWS_SECRET_ACCESS_KEY": CANARIES["entropy"], "HF_TOKEN": CANARIES["hugging_face"],
                "GITHUB_TOKEN": CANARIES["github"], "ITO_CANARY": CANARIES["aws"]}


def _secrets(api) -> list[str]:
    tokens = [open(api.tokens[name]).read().strip() for name in ("account", "desk", "other")]
    return [*CANARIES.values(), *tokens]


def test_canaries_in_token_file_manifest_and_environment_never_appear(api, tmp_path) -> None:
    booking, run = api.started_run()
    manifest_with_secret = api.manifest(notes=CANARIES["aws"])
    bad_token_file = api.root / api.unique("canary.token")
    bad_token_file.write_text(CANARIES["github"] + "\n")
    bad_token_file.chmod(0o600)
    env = {**api.env("account"), **ENV_CANARIES}
    calls = [
        (env, ["status", run, "--json"]),
        (env, ["logs", run, "--json"]),
        (env, ["train", "--booking", booking, "--manifest", manifest_with_secret, "--confirmation-ref",
               "cfr_" + "0" * 26, "--idempotency-key", "canary-key-0001", "--json"]),
        (env, ["train", "--booking", booking, "--manifest", api.manifest(), "--confirmation-ref",
               CANARIES["github"], "--idempotency-key", "canary-key-0002", "--json"]),
        (env, ["train", "--booking", booking, "--manifest", api.manifest(), "--confirmation-ref",
               "cfr_" + "0" * 26, "--idempotency-key", CANARIES["github"], "--json"]),
        (env, ["confirm", "request", "--action", "train", "--booking", booking, "--manifest",
               manifest_with_secret]),
        ({**env, "ITO_TOKEN_FILE": str(bad_token_file)}, ["status", run, "--json"]),
        ({**env, "ITO_TOKEN_FILE": str(bad_token_file)}, ["status", run]),
        ({**api.env("desk"), **ENV_CANARIES}, ["desk", "tokens", "issue", "--account", api.accounts["account"],
                                               "--out", str(tmp_path / "issued.token"), "--json"]),
        (env, ["--bogus", CANARIES["jwt"]]),
    ]
    secrets = _secrets(api)
    outputs = []
    for call_env, argv in calls:
        done = ito_subprocess(call_env, *argv)
        outputs.append(done.stdout + done.stderr)
    issued = (tmp_path / "issued.token").read_text().strip()
    outputs.append(api.server.log())
    for text in outputs:
        for secret in [*secrets, issued]:
            assert secret not in text
    assert (tmp_path / "issued.token").stat().st_mode & 0o777 == 0o600


def test_revoked_token_stops_status_watch_at_once(api) -> None:
    token_file = api.root / api.unique("watch.token")
    issued = api.ok("desk", "tokens", "issue", "--account", api.accounts["account"], "--out", str(token_file),
                    token="desk")
    _booking, run = api.started_run()
    env = {k: v for k, v in api.env(str(token_file)).items() if v is not None}
    watcher = subprocess.Popen([sys.executable, "-m", "ito_assets.api.cli", "status", run, "--watch",
                                "--interval", "0.2", "--max-wait", "120", "--json"],
                               env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert watcher.poll() is None  # still watching a queued run
    api.ok("desk", "tokens", "revoke", issued["token_id"], token="desk")
    revoked_at = time.monotonic()
    stdout, stderr = watcher.communicate(timeout=30)
    assert time.monotonic() - revoked_at < 5  # within a poll interval or two, not --max-wait
    document = read_json_line(stdout)
    assert watcher.returncode == 1 and document["error"]["code"] == "CREDENTIAL_REVOKED"
    assert "login" not in (stdout + stderr).lower()


def test_watch_prints_one_document_when_the_run_ends(api) -> None:
    import threading

    from ito_assets.control.ledger import open_ledger
    from ito_assets.control import runs
    from ito_assets.control.states import RunState

    _booking, run = api.started_run()
    ledger = open_ledger(f"sqlite:///{api.server.ledger_path}", create=False)

    def finish() -> None:  # the Dagster shell's role: report progress through the core
        time.sleep(0.5)
        runs.set_state(ledger, run, RunState.RUNNING)
        runs.set_state(ledger, run, RunState.SUCCEEDED)

    threading.Thread(target=finish).start()
    done = ito_subprocess(api.env("account"), "status", run, "--watch", "--interval", "0.2", "--json")
    ledger.dispose()
    document = read_json_line(done.stdout)
    assert document["ok"] and document["data"]["state"] == "succeeded" and document["notice"] is None


def test_manifest_canary_is_refused_before_any_byte_is_sent(api) -> None:
    document = valid_manifest()
    document["data"][0]["uri"] = CANARIES["url"]
    path = api.manifest(document)
    result = api.ito("confirm", "request", "--action", "train", "--booking", api.booking(), "--manifest", path)
    assert result["error"]["code"] == "MANIFEST_CONTAINS_SECRET" and result["live_api_contacted"] is False
