"""`ito serve [--host 127.0.0.1] [--port 8765] [--ready-file PATH]`: run the canonical API.

Loopback by default: bearer tokens travel in clear over plain HTTP, so another address needs
--allow-non-loopback (and a TLS-terminating proxy in front of it).
"""

from __future__ import annotations

import argparse

from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("serve", help="run the canonical API (Starlette/uvicorn)")
    parser.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8765; 0 picks a free one)")
    parser.add_argument("--ready-file", help="write the API URL here once listening (for scripts and tests)")
    parser.add_argument("--allow-non-loopback", action="store_true", help="bind a non-loopback address")
    parser.add_argument("--json", action="store_true", help="print one JSON document when the server stops")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api import server
    from ito_assets.api.client_config import is_loopback

    host = args.host or server.DEFAULT_HOST
    port = server.DEFAULT_PORT if args.port is None else args.port
    if not is_loopback(host) and not args.allow_non_loopback:
        raise ItoError(ErrorCode.USAGE_ERROR, "refusing a non-loopback address without --allow-non-loopback")
    if not 0 <= port <= 65535:
        raise ItoError(ErrorCode.USAGE_ERROR, "--port must be between 0 and 65535")
    server.serve(server.load_config(host, port), ready_file=args.ready_file)
    return VerbResult(data={"stopped": True}, text=["ito serve: stopped"])
