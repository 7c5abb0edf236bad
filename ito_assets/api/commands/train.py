"""`ito train --booking ID --manifest PATH --confirmation-ref REF --idempotency-key KEY --json`.

Order matters, so that whatever can refuse without a credential or the network does so first:
capabilities (fail closed before any credential is resolved), then every local check that needs no
network (reference form, key form, secure manifest read), then the token, then one idempotent
request that carries the digest and the very bytes hashed.
"""

from __future__ import annotations

import argparse

from ito_assets.api.commands.result import VerbResult
from ito_assets.errors import ErrorCode, ItoError


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("train", help="create the training run (all five gates must pass)")
    parser.add_argument("--booking", required=True, help="server-verified booking id")
    parser.add_argument("--manifest", required=True, help="absolute path of the reviewed manifest")
    parser.add_argument("--confirmation-ref", required=True, help="opaque cfr_ reference approved by the desk")
    parser.add_argument("--idempotency-key", required=True, help="stable retry key (8-128 characters)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> VerbResult:
    from ito_assets.api.client_config import connect
    from ito_assets.api.commands.confirm import read_manifest_for_upload
    from ito_assets.api.commands.readiness import client_verbs, require_local_capabilities
    from ito_assets.control.fingerprint import request_fingerprint, validate_key
    from ito_assets.control.ids import is_confirmation_ref

    require_local_capabilities(client_verbs(args))
    if not is_confirmation_ref(args.confirmation_ref):
        # A pasted token or anything else that is not a reference never travels.
        raise ItoError(ErrorCode.CONFIRMATION_INVALID, "the confirmation reference is malformed (expected cfr_...)")
    key = validate_key(args.idempotency_key)
    digest, content = read_manifest_for_upload(args.manifest)
    client = connect(timeout_s=args.timeout)
    body = {"booking_id": args.booking, "manifest_digest": digest, "manifest_b64": content,
            "confirmation_ref": args.confirmation_ref, "idempotency_key": key}
    fingerprint = request_fingerprint("train", booking_id=args.booking, manifest_digest=digest)
    data = client.post_idempotent("/v1/runs", body, key=key, action="train", fingerprint=fingerprint)
    verb = "replayed" if data.get("replayed") else "created"
    text = [f"run {verb}: {data.get('run_id')}", f"state: {data.get('state')}",
            f"booking: {data.get('booking_id')}", f"manifest: {data.get('manifest_sha256')}",
            f"idempotency key: {data.get('idempotency_key')}"]
    return VerbResult(data=data, live_api_contacted=client.contacted, text=text)
