"""POST /v1/confirmations: the server prices a mutation and issues an unapproved confirmation.

The answer carries the opaque reference once, with the binding a human must see; approval is
the desk's, out of band (routes/desk.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from ito_assets.api.bodies import ConfirmationBody
from ito_assets.api.routes.common import Api, decode_b64, endpoint, require
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import confirm_request, intake
from ito_assets.control.identity import Identity
from ito_assets.control.states import Action


def _request(api: Api, who: Identity, _request: Request, body: ConfirmationBody) -> dict:
    try:
        action = Action(body.action)
    except ValueError:
        raise ItoError(ErrorCode.USAGE_ERROR, "field 'action' must be train, cancel, cleanup or release") from None
    if action is Action.TRAIN:
        verified = intake.verify_submitted(decode_b64(require(body, "manifest_b64"), "manifest_b64"),
                                           require(body, "manifest_digest"), max_bytes=api.policy.max_manifest_bytes)
        issued = confirm_request.request_train(api.ledger, api.policy, who, require(body, "booking_id"), verified)
    elif action is Action.CANCEL:
        issued = confirm_request.request_cancel(api.ledger, api.policy, who, require(body, "run_id"))
    elif action is Action.RELEASE:
        issued = confirm_request.request_release(api.ledger, api.policy, who, require(body, "booking_id"))
    else:
        issued = confirm_request.request_cleanup(api.ledger, api.policy, who)
    return {"confirmation_ref": issued.ref, "binding": issued.confirmation.binding(),
            "approval": "pending: the booking desk approves out of band with `ito desk approve`"}


def routes(api: Api) -> list[Route]:
    return [Route("/v1/confirmations", endpoint(api, _request, body=ConfirmationBody), methods=["POST"])]
