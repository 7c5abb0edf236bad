"""A real `ito serve` on a free loopback port, and the `ito` client run against it.

The client runs in process through `cli.run` (the same code path as the console script, without
a Python start per call) with the environment of the call; tests that need a separate process
(output capture, races, --watch) use `ito_subprocess`.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from helpers import valid_manifest, write_manifest
from ito_assets.api import cli

PYTHON = sys.executable
HOUR = 3600


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Server:
    """`python -m ito_assets.api.cli serve --port 0` in its own state folder."""

    def __init__(self, root: Path, **env: str):
        self.root = root
        self.state_dir = root / "state"
        self.data_root = root / "data"
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.ledger_path = self.state_dir / "ledger.db"
        self.log_path = root / "serve.log"
        self.env = {**os.environ, "ITO_STATE_DIR": str(self.state_dir), "ITO_DATA_ROOT": str(self.data_root),
                    "ITO_LEDGER_URL": f"sqlite:///{self.ledger_path}", **env}
        ready = root / "ready"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [PYTHON, "-m", "ito_assets.api.cli", "serve", "--port", "0", "--ready-file", str(ready)],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ito serve did not start: " + self.log_path.read_text())
            time.sleep(0.02)
        self.url = ready.read_text().strip()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Client:
    """The `ito` client configured for one server, with the desk's and two accounts' tokens."""

    def __init__(self, server: Server, root: Path):
        self.server = server
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.tokens: dict[str, str] = {}
        self._counter = 0
        self.tokens["desk"] = str(root / "desk.token")
        with environment({"ITO_LEDGER_URL": server.env["ITO_LEDGER_URL"], "ITO_STATE_DIR": str(server.state_dir),
                          "ITO_LEDGER_SCHEMA": server.env.get("ITO_LEDGER_SCHEMA")}):
            doc, status = cli.run(["desk", "bootstrap", "--token-out", self.tokens["desk"], "--json"])
        assert status == 0, doc
        self.accounts = {name: self.new_account(name) for name in ("account", "other")}

    def unique(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}-{os.getpid()}-{self._counter:05d}"

    def new_account(self, name: str) -> str:
        account_id = self.ok("desk", "accounts", "create", "--name", self.unique(name), token="desk")["account_id"]
        self.tokens[name] = self.issue_token(account_id, name)
        return account_id

    def issue_token(self, account_id: str, name: str) -> str:
        path = str(self.root / f"{self.unique(name)}.token")
        self.ok("desk", "tokens", "issue", "--account", account_id, "--out", path, token="desk")
        return path

    def env(self, token: str | None = "account", **extra: str) -> dict[str, str | None]:
        token_file = self.tokens.get(token, token) if token else None
        return {"ITO_API_URL": self.server.url, "ITO_TOKEN_FILE": token_file, "ITO_TIMEOUT_S": "30", **extra}

    def ito(self, *argv: str, token: str | None = "account", **extra: str) -> dict:
        args = [*argv, "--json"] if "--json" not in argv else list(argv)
        with environment(self.env(token, **extra)):
            document, _status = cli.run(args)
        document.pop("_text", None)
        return document

    def ok(self, *argv: str, token: str | None = "account", **extra: str) -> dict:
        document = self.ito(*argv, token=token, **extra)
        assert document["ok"], document
        return document["data"]

    # --- builders ---------------------------------------------------------------------------

    def booking(self, account: str = "account", *, complete: bool = True, price: int = 100,
                region: str = "eu-west") -> str:
        now = int(time.time())
        booking = self.ok("desk", "bookings", "create", "--account", self.accounts[account], "--gpu-type", "H100",
                          "--gpus", "8", "--nodes", "1", "--topology", "1x8-nvlink", "--region", region,
                          "--network", "ib-400g", "--start", str(now - HOUR), "--end", str(now + 47 * HOUR),
                          "--price-cents", str(price), token="desk")["booking_id"]
        if complete:
            self.ok("desk", "bookings", "complete", booking, token="desk")
        return booking

    def manifest(self, document: dict | None = None, **top_level) -> str:
        document = document or valid_manifest()
        # A unique name per manifest: the budget cap counts earlier runs of the same digest.
        document["name"] = self.unique("m")
        document.update(top_level)
        path = self.root / f"{self.unique('manifest')}.json"
        return write_manifest(path, document)

    def confirm_train(self, booking: str, manifest: str, *, approve: bool = True, account: str = "account") -> str:
        data = self.ok("confirm", "request", "--action", "train", "--booking", booking, "--manifest", manifest,
                       token=account)
        if approve:
            self.approve(data["confirmation_ref"], data["binding"]["cost_cents"])
        return data["confirmation_ref"]

    def approve(self, ref: str, cost: int = 0) -> None:
        self.ok("desk", "approve", ref, "--cost-cents", str(cost), token="desk")

    def train(self, booking: str, manifest: str, ref: str, key: str, token: str = "account", **extra) -> dict:
        return self.ito("train", "--booking", booking, "--manifest", manifest, "--confirmation-ref", ref,
                        "--idempotency-key", key, token=token, **extra)

    def started_run(self, account: str = "account") -> tuple[str, str]:
        """(booking, run id) of a freshly created, queued run."""
        booking = self.booking(account)
        manifest = self.manifest()
        run = self.train(booking, manifest, self.confirm_train(booking, manifest, account=account),
                         self.unique("key"), token=account)
        assert run["ok"], run
        return booking, run["data"]["run_id"]


def ito_subprocess(env: dict[str, str | None], *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([PYTHON, "-m", "ito_assets.api.cli", *argv], env=full, capture_output=True,
                          text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def fake_api(mode: str) -> Iterator[str]:
    """A loopback listener that misbehaves: "silent" accepts and never answers; "hangup" reads
    the request and closes without a byte of answer; "bare401" answers 401 without a body, as
    an authenticating proxy in front of the API would."""
    with fake_api_holding(mode) as (url, _held):
        yield url


@contextlib.contextmanager
def fake_api_holding(mode: str) -> Iterator[tuple[str, list[socket.socket]]]:
    """`fake_api`, also yielding the connections a "silent" listener holds open (to count them)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            if mode in ("hangup", "bare401"):
                conn.settimeout(1)
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    if mode == "bare401":
                        conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def read_request(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 request (Content-Length framed) read from `conn`."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def read_json_line(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected exactly one JSON document, got {len(lines)} lines"
    return json.loads(lines[0])


def _default_signals() -> None:
    # A test worker that ran Dagster in process has SIGTERM mapped to KeyboardInterrupt (Dagster's
    # interrupt handling); a forked caller inheriting that may not die when the pool ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def map_in_forked_callers(call: Callable, jobs: Sequence, num_callers: int) -> list:
    """`call` over `jobs` in `num_callers` forked processes (each its own client, started without a
    new interpreter); the callers finish their queue and exit before this returns."""
    pool = multiprocessing.get_context("fork").Pool(num_callers, initializer=_default_signals)
    try:
        return pool.map(call, jobs, chunksize=1)
    finally:
        pool.close()
        pool.join()
