"""`ito confirm request --action train|cancel|cleanup|release [--booking ID] [--manifest PATH] [--run ID]`:
the server prices the mutation and issues an opaque, unapproved reference with the binding a
human must see. Approval happens out of band (`ito desk approve`). Creates no workload.
"""

from __future__ import annotations

import argparse
import base64

from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError


def register(verbs: argparse._SubParsersAction) -> None:
    group = verbs.add_parser("confirm", help="request a single-use confirmation for train, cancel or cleanup")
    actions = group.add_subparsers(dest="confirm_action", required=True, parser_class=type(group))
    request = actions.add_parser("request", help="ask the API to price a mutation and issue a reference")
    request.add_argument("--action", required=True, choices=["train", "cancel", "cleanup", "release"])
    request.add_argument("--booking", help="server-verified booking id (train, release)")
    request.add_argument("--manifest", help="absolute path of the reviewed manifest (train)")
    request.add_argument("--run", help="run id (cancel)")
    request.add_argument("--json", action="store_true", help="print one JSON document")
    request.set_defaults(handler=_request)


def read_manifest_for_upload(path: str) -> tuple[str, str]:
    """Securely read and verify the manifest here, before anything is sent: a manifest holding a
    secret never leaves this machine. Returns (digest, base64 of the very bytes hashed)."""
    from ito_assets.manifest.verify import require_provenance, verify_manifest
    from ito_assets.settings import load_settings

    verified = verify_manifest(path, max_bytes=load_settings().max_manifest_bytes)
    require_provenance(verified.manifest)
    return verified.digest, base64.b64encode(verified.raw.data).decode("ascii")


def _request(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api.client_config import connect

    body: dict = {"action": args.action}
    if args.action == "train":
        if not args.booking or not args.manifest or args.run:
            raise ItoError(ErrorCode.USAGE_ERROR, "--action train needs --booking and --manifest (and no --run)")
        digest, content = read_manifest_for_upload(args.manifest)
        body.update(booking_id=args.booking, manifest_digest=digest, manifest_b64=content)
    elif args.action == "cancel":
        if not args.run or args.booking or args.manifest:
            raise ItoError(ErrorCode.USAGE_ERROR, "--action cancel needs --run (and no --booking or --manifest)")
        body.update(run_id=args.run)
    elif args.action == "release":
        if not args.booking or args.manifest or args.run:
            raise ItoError(ErrorCode.USAGE_ERROR, "--action release needs --booking (and no --manifest or --run)")
        body.update(booking_id=args.booking)
    elif args.booking or args.manifest or args.run:
        raise ItoError(ErrorCode.USAGE_ERROR, "--action cleanup is per tenant and takes no --booking, --manifest or --run")
    client = connect(timeout_s=args.timeout)
    data = client.post("/v1/confirmations", body)
    binding = data.get("binding", {})
    text = [
        f"confirmation reference: {data.get('confirmation_ref')}",
        f"action: {binding.get('action')}  account: {binding.get('account_id')}",
        f"booking: {binding.get('booking_id')}  run: {binding.get('run_id')}",
        f"manifest: {binding.get('manifest_digest')}",
        f"cost: {binding.get('cost_cents', 0) / 100:.2f} USD  expires at: {binding.get('expires_at')}",
        "approval: pending (the booking desk approves with `ito desk approve`)",
    ]
    return VerbResult(data=data, live_api_contacted=client.contacted, text=text)
