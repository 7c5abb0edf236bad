"""Where the client finds the API and its identity, read once per command at the edge.

ITO_API_URL (default http://127.0.0.1:8765), ITO_TOKEN_FILE (a 0600 file owned by the user,
holding one identity token), ITO_CONNECT_TIMEOUT_S (default 3), ITO_TIMEOUT_S (default 30, per
request). The whole operation is bounded apart from these by `ito --timeout` (default 120).
A token is never an argument and never printed; errors about the token file name the variable,
never its value (a token pasted into ITO_TOKEN_FILE by mistake must not be echoed).
These are fields of the one settings model (settings.ItoSettings) and parsed by its env.parse; they
are read here without that model, whose import (pydantic-settings) would slow every client call.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

from ito_assets import env as env_text
from ito_assets.api.client import ApiClient, Deadline, Endpoint, HttpTransport
from ito_assets.errors import ErrorCode, ItoError

DEFAULT_API_URL = "http://127.0.0.1:8765"
# 3 s to connect: a loopback or LAN API connects in milliseconds; longer means it is down.
DEFAULT_CONNECT_TIMEOUT_S = 3.0
# 30 s in all: creating a run waits at most the ledger's lock timeout (30 s) behind a twin.
DEFAULT_TOTAL_TIMEOUT_S = 30.0
_MAX_TOKEN_FILE_BYTES = 4096


@dataclass(frozen=True)
class ClientConfig:
    endpoint: Endpoint
    token_file: str | None
    connect_timeout_s: float
    total_timeout_s: float


# The ItoSettings fields this module reads (tests hold them to the model's).
FIELDS = ("api_url", "token_file", "connect_timeout_s", "timeout_s")


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return env_text.parse(env.get(name), default=default, whole=False, low=0, low_open=True, high=3600, message=f"{name} must be a number of seconds between 0 and 3600")


_IPV4_LOOPBACK = re.compile(r"^127(\.\d{1,3}){3}$")


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1. The common forms are matched without `ipaddress`, whose
    import alone costs a client start ~15 ms."""
    if host in ("localhost", "::1") or _IPV4_LOOPBACK.fullmatch(host):
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _endpoint(url: str) -> Endpoint:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise ItoError(ErrorCode.USAGE_ERROR, "ITO_API_URL must be http(s)://host[:port] without credentials")
    # A bearer token must never cross a network in clear: plain http is for loopback only.
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ItoError(ErrorCode.USAGE_ERROR, "ITO_API_URL must use https unless the API is on loopback")
    try:
        port = parts.port
    except ValueError:  # not a number, or above 65535
        port = 0
    if port == 0:  # no server listens on port 0: it is no default's stand-in
        raise ItoError(ErrorCode.USAGE_ERROR, "ITO_API_URL's port must be a number from 1 to 65535")
    # The API's routes are at the root: a path, query or fragment would be dropped without a word.
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ItoError(ErrorCode.USAGE_ERROR, "ITO_API_URL must be http(s)://host[:port] with no path, query or "
                                              "fragment")
    return Endpoint(scheme=parts.scheme, host=parts.hostname, port=port or (443 if parts.scheme == "https" else 80))


def load_client_config(env: Mapping[str, str] | None = None) -> ClientConfig:
    env = env_text.environment(env)
    return ClientConfig(
        endpoint=_endpoint(env.get("ITO_API_URL") or DEFAULT_API_URL),
        token_file=env.get("ITO_TOKEN_FILE") or None,
        connect_timeout_s=_seconds(env, "ITO_CONNECT_TIMEOUT_S", DEFAULT_CONNECT_TIMEOUT_S),
        total_timeout_s=_seconds(env, "ITO_TIMEOUT_S", DEFAULT_TOTAL_TIMEOUT_S),
    )


def _auth_error(message: str) -> ItoError:
    error = ItoError(ErrorCode.AUTH_REQUIRED, message)
    error.live_api_contacted = False
    return error


def read_token(path: str | None) -> str:
    """The identity token from ITO_TOKEN_FILE: an absolute path to a regular file (no link),
    owned by this user, readable by nobody else (0600 or stricter), holding one ito token."""
    from ito_assets.control.ids import TOKEN

    if not path:
        raise _auth_error("no identity: set ITO_TOKEN_FILE to the absolute path of the 0600 token file the desk "
                          f"issued; {walkthrough_tokens_hint()}")
    if not os.path.isabs(path):
        raise _auth_error("ITO_TOKEN_FILE must be an absolute path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        raise _auth_error("the file ITO_TOKEN_FILE names cannot be opened (missing, or a symbolic link); "
                          f"{walkthrough_tokens_hint()}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _auth_error("the file ITO_TOKEN_FILE names must be a regular file")
        if st.st_uid != os.geteuid():
            raise _auth_error("the file ITO_TOKEN_FILE names must be owned by the current user")
        if st.st_mode & 0o077:
            raise _auth_error("the file ITO_TOKEN_FILE names must not be accessible to group or others (chmod 600)")
        data = os.read(fd, _MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    token = data.decode("ascii", errors="replace").strip()
    if len(data) > _MAX_TOKEN_FILE_BYTES or TOKEN.fullmatch(token) is None:
        raise _auth_error("the file ITO_TOKEN_FILE names does not hold an ito identity token")
    return token


def walkthrough_tokens_hint() -> str:
    """Where `make run` (the API walkthrough) left its desk and account tokens, newest first, or
    how to make a first one. Names files, never their contents."""
    try:
        from ito_assets.settings import load_settings  # here only: its import slows every client call

        folder = load_settings().state_dir / "walkthrough"
        tokens = sorted(folder.glob("*.token"), key=lambda p: p.stat().st_mtime, reverse=True)
    except Exception:  # noqa: BLE001 - a hint must never hide the error it belongs to
        tokens = []
    if not tokens:
        return "on the server's machine `ito desk bootstrap --token-out PATH` writes a first desk token"
    names = ", ".join(t.name for t in tokens[:2])
    return f"`make run` left its tokens in {tokens[0].parent}/ (newest: {names})"


def connect(*, timeout_s: float, authenticated: bool = True, env: Mapping[str, str] | None = None) -> ApiClient:
    """An ApiClient for this command: the token is read here, after every local check passed.
    `timeout_s` (the CLI's --timeout) bounds everything the client does from here on; the
    transport and the client share one Deadline, so no request outlives it."""
    config = load_client_config(env)
    token = read_token(config.token_file) if authenticated else None
    deadline = Deadline(timeout_s)
    transport = HttpTransport(config.endpoint, token, connect_timeout_s=config.connect_timeout_s,
                              total_timeout_s=config.total_timeout_s, deadline=deadline)
    return ApiClient(transport, deadline=deadline)
