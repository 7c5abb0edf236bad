"""The shape of every request the API accepts: one strict pydantic model per route that takes a
body, one per query string, and the bound on path parameters.

The models check shape and size only (type, range, length, no NUL byte, no unknown field); the
gates still decide meaning (a reference's form, a booking's consistency), so a well-shaped but
wrong value keeps its own error code. The bounds are the contract, documented per field:

- identifiers, references and idempotency keys: at most 256 characters (twice the longest form
  any gate accepts, so a near miss still gets the gate's own code, e.g. IDEMPOTENCY_KEY_INVALID);
- account names and token labels: at most 128 characters (the ledger's column width);
- booking labels (gpu_type, topology, region, network): at most 64 characters;
- manifest digests: at most 128 characters; a base64 manifest: at most the body limit;
- num_gpus, num_nodes: 1..65536; prices per GPU-hour: 1..10**15 cents; approved costs:
  0..10**15 cents; timestamps: 0..2**53 seconds; paging: after 0..2**63-1, limit 1..500 (runs:
  after a run id, limit 1..500).

NUL bytes are refused in every string: PostgreSQL cannot store one, and no field needs one.
Messages name the field and the rule, never the value, and never a field the route does not
know (its name came from the caller).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Mapping, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.runs import MAX_PAGE as MAX_RUNS_PAGE
from ito_assets.control.telemetry import MAX_PAGE

MAX_BODY_BYTES = 1024 * 1024  # a base64 manifest at the 256 KiB read limit is ~342 KiB
MAX_ID_CHARS = 256
MAX_NAME_CHARS = 128
MAX_LABEL_CHARS = 64
MAX_DIGEST_CHARS = 128
MAX_CHOICE_CHARS = 16
MAX_TIMESTAMP = 2**53  # exact in a JSON double, far beyond any booking window
MAX_CENTS = 10**15  # ten trillion dollars
MAX_GPUS = 65536
MAX_SEQ = 2**63 - 1  # the ledger's BIGINT sequence numbers


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("NUL")
    return value


def _text(max_chars: int) -> Any:
    return Annotated[str, StringConstraints(max_length=max_chars), AfterValidator(_no_nul)]


Id = _text(MAX_ID_CHARS)
Name = _text(MAX_NAME_CHARS)
Label = _text(MAX_LABEL_CHARS)
Digest = _text(MAX_DIGEST_CHARS)
Choice = _text(MAX_CHOICE_CHARS)
Manifest64 = _text(MAX_BODY_BYTES)
Timestamp = Annotated[int, Field(ge=0, le=MAX_TIMESTAMP)]
Cost = Annotated[int, Field(ge=0, le=MAX_CENTS)]
Price = Annotated[int, Field(ge=1, le=MAX_CENTS)]
Count = Annotated[int, Field(ge=1, le=MAX_GPUS)]


class Strict(BaseModel):
    # strict: no coercion ("8" is not 8, true is not 1, 1.0 is not 1); frozen: handlers only read.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TrainBody(Strict):
    """POST /v1/runs"""

    booking_id: Id
    manifest_digest: Digest
    manifest_b64: Manifest64
    confirmation_ref: Id
    idempotency_key: Id


class CancelBody(Strict):
    """POST /v1/runs/{run_id}/cancel"""

    confirmation_ref: Id
    idempotency_key: Id


class CleanupBody(Strict):
    """POST /v1/cleanup; release_confirmation_ref is required when release_booking_id is given."""

    confirmation_ref: Id
    idempotency_key: Id
    release_booking_id: Id | None = None
    release_confirmation_ref: Id | None = None


class ConfirmationBody(Strict):
    """POST /v1/confirmations; which optional field is required depends on the action."""

    action: Choice
    booking_id: Id | None = None
    run_id: Id | None = None
    manifest_digest: Digest | None = None
    manifest_b64: Manifest64 | None = None


class AccountBody(Strict):
    """POST /v1/desk/accounts"""

    name: Name


class TokenBody(Strict):
    """POST /v1/desk/tokens"""

    role: Choice
    account_id: Id | None = None
    label: Name | None = None


class RevokeBody(Strict):
    """POST /v1/desk/tokens/revoke"""

    token_id: Id


class BookingBody(Strict):
    """POST /v1/desk/bookings"""

    account_id: Id
    gpu_type: Label
    num_gpus: Count
    num_nodes: Count
    topology: Label
    region: Label
    network: Label
    starts_at: Timestamp
    ends_at: Timestamp
    price_per_gpu_hour_cents: Price


class AmendBody(Strict):
    """POST /v1/desk/bookings/{booking_id}/amend: the amendable terms (gates.bookings.AMENDABLE)."""

    region: Label | None = None
    network: Label | None = None
    topology: Label | None = None
    starts_at: Timestamp | None = None
    ends_at: Timestamp | None = None
    price_per_gpu_hour_cents: Price | None = None


class EmptyBody(Strict):
    """POST /v1/desk/bookings/{booking_id}/complete|revoke|release: nothing but the path."""


class ConfirmationRefBody(Strict):
    """POST /v1/desk/confirmations/show"""

    confirmation_ref: Id


class ApproveBody(Strict):
    """POST /v1/desk/confirmations/approve"""

    confirmation_ref: Id
    cost_cents: Cost
    manifest_digest: Digest | None = None


class DecisionBody(Strict):
    """POST /v1/desk/runs/{run_id}/proposals/{proposal_id}"""

    decision: Choice


class QuoteBody(Strict):
    """POST /v1/quotes: what a train confirmation for this booking and manifest would bind."""

    booking_id: Id
    manifest_digest: Digest
    manifest_b64: Manifest64


class RunsQuery(Strict):
    """?manifest_digest=&booking_id=&state=&after=&limit= on GET /v1/runs; `after` is a run id."""

    manifest_digest: Digest | None = None
    booking_id: Id | None = None
    state: Choice | None = None
    after: Id | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_RUNS_PAGE)] = 100


class BudgetsQuery(Strict):
    """?manifest_digest= on GET /v1/budgets and GET /v1/desk/accounts/{account_id}/budgets."""

    manifest_digest: Digest | None = None


class PageQuery(Strict):
    """?after=&limit= on the logs, metrics and checkpoints routes."""

    after: Annotated[int, Field(ge=0, le=MAX_SEQ)] = 0
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = 100


class BookingsQuery(Strict):
    """?account_id= on GET /v1/desk/bookings."""

    account_id: Id | None = None


Model = TypeVar("Model", bound=Strict)

_RANGE = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}


def _message(model: type[Strict], error: dict, what: str) -> str:
    name = error["loc"][0] if error["loc"] else None
    if error["type"] == "extra_forbidden" or name not in model.model_fields:
        accepted = ", ".join(model.model_fields) or "none"
        return f"the request has a {what} this route does not take (it takes: {accepted})"
    kind = error["type"]
    if kind in _RANGE:
        return f"{what} '{name}' is out of range"
    if kind == "string_too_long":
        return f"{what} '{name}' is too long"
    if kind == "value_error":  # the only custom check: _no_nul
        return f"{what} '{name}' contains a NUL character"
    return f"{what} '{name}' is missing or has the wrong type"


def parse(model: type[Model], data: Any, *, what: str = "field") -> Model:
    """`data` as `model`, or USAGE_ERROR naming the first field at fault."""
    if not isinstance(data, dict):
        raise ItoError(ErrorCode.USAGE_ERROR, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise ItoError(ErrorCode.USAGE_ERROR, _message(model, errors[0], what)) from None


_QUERY_INT = re.compile(r"-?[0-9]{1,20}")  # 20 digits hold any BIGINT; longer is out of range anyway


def parse_query(model: type[Model], items: list[tuple[str, str]]) -> Model:
    """A query string as `model`: integers for integer fields, each parameter at most once."""
    values: dict[str, Any] = {}
    for name, value in items:
        if name in values:
            raise ItoError(ErrorCode.USAGE_ERROR, "a query parameter is repeated")
        field = model.model_fields.get(name)
        if field is not None and field.annotation is int:
            if _QUERY_INT.fullmatch(value):
                values[name] = int(value)
            elif re.fullmatch(r"-?[0-9]+", value):
                raise ItoError(ErrorCode.USAGE_ERROR, f"parameter '{name}' is out of range")
            else:
                values[name] = value  # strict validation refuses it as the wrong type
        else:
            values[name] = value
    return parse(model, values, what="parameter")


def check_path_params(params: Mapping[str, Any]) -> None:
    """Path parameters are bounded like identifiers in a body, before any reaches the ledger."""
    for name, value in params.items():
        if isinstance(value, str) and (len(value) > MAX_ID_CHARS or "\x00" in value):
            raise ItoError(ErrorCode.USAGE_ERROR,
                           f"path parameter '{name}' is longer than {MAX_ID_CHARS} characters or contains NUL")
