"""`ito serve`: the canonical API (Starlette on uvicorn), loopback by default.

Configuration is read once here, at the edge: the settings (ITO_LEDGER_URL, default the SQLite
file under the state dir; ITO_LEDGER_SCHEMA), ITO_LEDGER_LOCK_TIMEOUT_S (above 0, at most 3600,
default 30), the socket edge's
ITO_API_READ_TIMEOUT_S (seconds to read a whole request, 0.1-3600, default 10) and
ITO_API_MAX_CONNECTIONS_PER_CLIENT (1-65536, default 32; api/transport.py), plus the gate
policy (control/policy.py). Bearer identity tokens travel in the Authorization header only; the
server neither logs requests nor echoes bodies, so no token or reference reaches a log.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from ito_assets.errors import ErrorCode, ItoError, disk_full, storage_full

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
# How long a ledger transaction may wait for another's lock: above 0 (0 or less waits not at all,
# and every concurrent write fails), at most an hour, the longest any client waits for one request
# (ITO_TIMEOUT_S and `ito --timeout` both stop at 3600 s).
LOCK_TIMEOUT_RANGE_S = (0.0, 3600.0)


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    ledger_url: str = field(repr=False)  # may carry the database's password
    ledger_schema: str | None = None
    lock_timeout_s: float = 30.0
    read_timeout_s: float = 10.0
    max_connections_per_client: int = 32
    # The settings load_config read, so that open_api builds the policy from the same reading.
    environment: Any = field(default=None, compare=False, repr=False)


def load_config(host: str, port: int, env: Mapping[str, str] | None = None) -> ServerConfig:
    """The server's configuration from the settings read once from `env` (default: the process
    environment); a bad value is a USAGE_ERROR naming the variable, never echoing the value."""
    from ito_assets import env as env_text
    from ito_assets.api.transport import (CONNECTIONS_PER_CLIENT_RANGE, MAX_CONNECTIONS_PER_CLIENT,
                                          READ_TIMEOUT_RANGE_S, READ_TIMEOUT_S)
    from ito_assets.control.ledger import DEFAULT_LOCK_TIMEOUT_S
    from ito_assets.settings import ItoSettings, settings_from

    environment = ItoSettings.read(env)
    low, high = LOCK_TIMEOUT_RANGE_S
    lock_s = env_text.parse(environment.ledger_lock_timeout_s, default=DEFAULT_LOCK_TIMEOUT_S, whole=False, low=low,
                            low_open=True, high=high, message=f"ITO_LEDGER_LOCK_TIMEOUT_S must be a number of seconds above {low:g} and at "
                                    f"most {high:g}")
    low, high = READ_TIMEOUT_RANGE_S
    read_timeout_s = env_text.parse(environment.api_read_timeout_s, default=READ_TIMEOUT_S, whole=False, low=low,
                                    high=high, message=f"ITO_API_READ_TIMEOUT_S must be a number of "
                                                                   f"seconds from {low:g} to {high:g}")
    low, high = CONNECTIONS_PER_CLIENT_RANGE
    per_client = env_text.parse(environment.api_max_connections_per_client, default=MAX_CONNECTIONS_PER_CLIENT,
                                whole=True, low=low, high=high, message=f"ITO_API_MAX_CONNECTIONS_PER_CLIENT must be a whole number from {low} "
                                        f"to {high}")
    settings = settings_from(environment)
    return ServerConfig(host=host, port=port, ledger_url=settings.ledger_url, ledger_schema=settings.ledger_schema,
                        lock_timeout_s=lock_s, read_timeout_s=read_timeout_s, max_connections_per_client=per_client,
                        environment=environment)


def build_app(api):
    """The Starlette application over `api` (routes.common.Api)."""
    from starlette.applications import Starlette
    from starlette.responses import Response

    from ito_assets.api import envelope
    from ito_assets.api.routes import budgets, confirmations, desk, meta, runs

    served = [*runs.routes(api), *budgets.routes(api), *confirmations.routes(api), *desk.routes(api)]
    all_routes = [*served, *meta.routes(api, meta.served_routes(served))]

    async def not_found(_request, _exc) -> Response:
        error = ItoError(ErrorCode.USAGE_ERROR, "no such API route")
        return Response(envelope.dumps(envelope.failure(error, live_api_contacted=True)), status_code=404,
                        media_type="application/json")

    app = Starlette(routes=all_routes, exception_handlers={404: not_found, 405: not_found})
    # Starlette answers a path with a stray trailing slash with a bare 307; every answer here is an
    # envelope, so such a path is just not a route.
    app.router.redirect_slashes = False
    return app


def open_api(config: ServerConfig, env: Mapping[str, str] | None = None):
    from ito_assets.api.routes.common import Api
    from ito_assets.control.policy import policy_from
    from ito_assets.settings import ItoSettings, settings_from

    environment = config.environment if env is None and config.environment is not None else ItoSettings.read(env)
    settings = settings_from(environment)
    policy = policy_from(settings, environment)  # refused before the ledger is touched
    # The ledger makes its own folder (0700) and file (0600): none is made here before it.
    ledger = opened_ledger(config.ledger_url, schema=config.ledger_schema, lock_timeout_s=config.lock_timeout_s,
                           variable=ledger_variable(settings))
    return Api(ledger=ledger, policy=policy)


def ledger_variable(settings) -> str:
    """The variable the settings' ledger URL came from, for the messages of `opened_ledger`."""
    return "ITO_LEDGER_URL" if settings.ledger_url_env else "ITO_STATE_DIR"


def opened_ledger(ledger_url: str, *, schema: str | None, lock_timeout_s: float | None = None, variable: str):
    """The ledger (for `ito serve` and `ito desk bootstrap`), or a coded refusal naming `variable`
    (where its URL came from) and the error's type only: a driver's message may hold the URL's
    host, user or password. `lock_timeout_s` None: the ledger's default."""
    import sqlite3

    import sqlalchemy as sa

    from ito_assets.control.ledger import open_ledger

    try:
        url = sa.engine.make_url(ledger_url)
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            # Each connection would get its own empty database: nothing written to it would stay.
            raise ItoError(ErrorCode.USAGE_ERROR, f"the ledger {_LEDGER_PLACES[variable][0]} must be a SQLite "
                                                  "file, not an in-memory database")
        timeout = {} if lock_timeout_s is None else {"lock_timeout_s": lock_timeout_s}
        return open_ledger(ledger_url, schema=schema, **timeout)
    except ItoError:
        raise  # already coded: a ledger migrated by a newer release, a bad ITO_LEDGER_SCHEMA
    # A malformed URL (ValueError: a port that is no number), a driver not installed (ImportError),
    # a database that is down or refuses the login, a folder that cannot be made (OSError), a
    # SQLite file that is no database or is a folder (sqlite3's own errors: the file is prepared
    # before SQLAlchemy opens it).
    except (sa.exc.SQLAlchemyError, sqlite3.Error, OSError, ValueError, ImportError) as error:
        if disk_full(error):
            raise storage_full("the ledger") from None
        where, hint = _LEDGER_PLACES[variable]
        raise ItoError(ErrorCode.USAGE_ERROR,
                       f"the ledger {where} cannot be opened ({type(error).__name__}): {hint}") from None


_LEDGER_PLACES = {
    "ITO_LEDGER_URL": ("ITO_LEDGER_URL names", "check the URL, and that its database is up and reachable"),
    "ITO_STATE_DIR": ("under ITO_STATE_DIR", "check that this user can create and write its folder"),
}


def bind(config: ServerConfig) -> socket.socket:
    """Bind before serving, so a caller passing port 0 learns the real port (`--ready-file`)."""
    from ito_assets.api.transport import BACKLOG

    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError:
        sock.close()
        raise ItoError(ErrorCode.USAGE_ERROR, "the API address is not available (port in use?)") from None
    sock.listen(BACKLOG)
    return sock


def write_ready_file(path: str, host: str, port: int) -> None:
    """Atomically publish the URL (rename), so a reader never sees half of it."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(f"http://{host}:{port}\n")
    os.replace(tmp, path)


def serve(config: ServerConfig, *, ready_file: str | None = None) -> None:
    import uvicorn

    from ito_assets.api.transport import EdgeLimits, uvicorn_config

    api = open_api(config)
    sock = bind(config)
    host, port = sock.getsockname()[:2]
    app = build_app(api)
    limits = EdgeLimits(read_timeout_s=config.read_timeout_s,
                        max_connections_per_client=config.max_connections_per_client)
    server = uvicorn.Server(uvicorn_config(app, limits))
    if ready_file:
        write_ready_file(ready_file, host, port)
    print(f"ito serve: listening on http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        api.ledger.dispose()
