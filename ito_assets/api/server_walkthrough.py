"""The whole flow of docs/api.md, end to end on the embedded default, for `make run` and for people:
start `ito serve` on a free loopback port, then through the `ito` client: the desk books, the
account requests a confirmation, the desk approves, the account trains, reads status and logs,
and (optionally) cancels and cleans up. Every step is the real client against the real server.

    python -m ito_assets.api.server_walkthrough [--manifest PATH] [--cancel]

Tokens live in 0600 files under <state>/walkthrough/; nothing secret is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ito_assets.settings import Settings, load_settings

_HOUR = 3600


@dataclass
class Walkthrough:
    """What the walk did: one line per step, and the identifiers it created."""

    steps: list[str] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def running_server(settings: Settings, folder: Path) -> Iterator[str]:
    """`ito serve --port 0` in a subprocess; yields its URL, stops it afterwards."""
    ready = folder / f"ready-{uuid.uuid4().hex[:8]}"
    log = open(folder / "serve.log", "ab")
    env = {**os.environ, "ITO_STATE_DIR": str(settings.state_dir), "ITO_DATA_ROOT": str(settings.data_root)}
    process = subprocess.Popen([sys.executable, "-m", "ito_assets.api.cli", "serve", "--port", "0",
                                "--ready-file", str(ready)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ito serve did not start; see {folder / 'serve.log'}")
            time.sleep(0.05)
        yield ready.read_text().strip()
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
        ready.unlink(missing_ok=True)


def _ito(*argv: str, token_file: Path | None, url: str) -> dict:
    from ito_assets.api import cli

    env = {"ITO_API_URL": url, **({"ITO_TOKEN_FILE": str(token_file)} if token_file else {})}
    with _env(env):
        document, _status = cli.run([*argv, "--json"])
    if not document["ok"]:
        raise RuntimeError(f"`ito {' '.join(argv[:2])}` failed: {document['error']['code']}")
    return document["data"]


def walk(settings: Settings, manifest: str, *, cancel: bool = False) -> Walkthrough:
    folder = settings.state_dir / "walkthrough"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tag = uuid.uuid4().hex[:8]
    desk_token, account_token = folder / f"desk-{tag}.token", folder / f"account-{tag}.token"
    out = Walkthrough()
    with running_server(settings, folder) as url, _env({"ITO_STATE_DIR": str(settings.state_dir)}):
        _ito("desk", "bootstrap", "--token-out", str(desk_token), token_file=None, url=url)
        def desk(*a: str) -> dict:
            return _ito("desk", *a, token_file=desk_token, url=url)

        def acct(*a: str) -> dict:
            return _ito(*a, token_file=account_token, url=url)

        account = desk("accounts", "create", "--name", f"walkthrough-{tag}")["account_id"]
        desk("tokens", "issue", "--account", account, "--out", str(account_token))
        now = int(time.time())
        booking = desk("bookings", "create", "--account", account, "--gpu-type", "H100", "--gpus", "8",
                       "--nodes", "1", "--topology", "1x8-nvlink", "--region", "eu-west", "--network", "ib-400g",
                       "--start", str(now - _HOUR), "--end", str(now + 47 * _HOUR), "--price-cents", "100")["booking_id"]
        desk("bookings", "complete", booking)
        out.steps.append(f"desk booked {booking} for account {account}")
        requested = acct("confirm", "request", "--action", "train", "--booking", booking, "--manifest", manifest)
        binding = requested["binding"]
        out.steps.append(f"account requested a train confirmation: cost {binding['cost_cents']} cents")
        desk("approve", requested["confirmation_ref"], "--cost-cents", str(binding["cost_cents"]),
             "--manifest-digest", binding["manifest_digest"])
        out.steps.append("desk approved it out of band")
        key = f"walkthrough-{tag}"
        run = acct("train", "--booking", booking, "--manifest", manifest, "--confirmation-ref",
                   requested["confirmation_ref"], "--idempotency-key", key)
        out.steps.append(f"account created run {run['run_id']} ({run['state']})")
        out.steps.append(f"status: {acct('status', '--idempotency-key', key)['state']}; "
                         f"logs: {acct('logs', run['run_id'])['num_logs']} lines")
        out.ids.update(account_id=account, booking_id=booking, run_id=run["run_id"], idempotency_key=key)
        if cancel:
            ref = acct("confirm", "request", "--action", "cancel", "--run", run["run_id"])["confirmation_ref"]
            desk("approve", ref, "--cost-cents", "0")
            state = acct("cancel", run["run_id"], "--confirmation-ref", ref, "--idempotency-key", f"cancel-{tag}")
            out.steps.append(f"account cancelled the run: {state['state']}")
            ref = acct("confirm", "request", "--action", "cleanup")["confirmation_ref"]
            desk("approve", ref, "--cost-cents", "0")
            report = acct("cleanup", "--confirmation-ref", ref, "--idempotency-key", f"cleanup-{tag}")
            out.steps.append(f"account cleaned up {report['num_runs_cleaned']} finished run(s); booking untouched")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Walk the whole ito flow against a real `ito serve`.")
    settings = load_settings()
    parser.add_argument("--manifest", default=str(settings.manifests_dir / "fixture-small.json"))
    parser.add_argument("--cancel", action="store_true", help="also cancel the run and clean up")
    args = parser.parse_args(argv)
    result = walk(settings, os.path.realpath(args.manifest), cancel=args.cancel)
    for step in result.steps:
        print(step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
