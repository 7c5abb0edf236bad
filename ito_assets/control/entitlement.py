"""Gate 1, entitlement: a fresh training eligibility computed from the booking at request time.

Only a completed booking verified by the server entitles (never the client's word); the eligibility
is bound to the account, booking, GPU topology, region, network and duration. Expired, revoked,
released, incomplete, another account's or mismatched bookings fail closed, and so does a booking
whose window [starts_at, ends_at) has not begun: its GPUs are not the account's yet.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.bookings import Booking
from ito_assets.control.states import BookingState

_STATE_CODES = {
    BookingState.PENDING: (ErrorCode.BOOKING_INCOMPLETE, "the booking is not completed"),
    BookingState.EXPIRED: (ErrorCode.BOOKING_EXPIRED, "the booking has expired"),
    BookingState.REVOKED: (ErrorCode.BOOKING_REVOKED, "the booking was revoked"),
    BookingState.RELEASED: (ErrorCode.BOOKING_RELEASED, "the booking was released"),
}
_NETWORK_FIELDS = ("region", "network")


@dataclass(frozen=True, kw_only=True)
class Eligibility:
    account_id: str
    booking_id: str
    booking_revision: int
    gpu_type: str
    num_gpus: int
    num_nodes: int
    topology: str
    region: str
    network: str
    starts_at: int
    ends_at: int
    duration_s: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def to_dict(self) -> dict:
        return asdict(self)


def eligibility(booking: Booking | None, account_id: str, now: int, *, require_started: bool = True) -> Eligibility:
    """The eligibility of `account_id` to train on `booking` at `now`, or the code that refuses it.

    Another account's booking answers BOOKING_NOT_FOUND, exactly like an unknown id: a caller
    learns nothing about bookings that are not theirs. Training (confirm, train, the job's
    re-verification) needs the window begun; `require_started=False` is for what may come
    before it: a quote, and releasing the booking.
    """
    if booking is None or booking.account_id != account_id:
        raise ItoError(ErrorCode.BOOKING_NOT_FOUND, "no such booking for this account")
    if booking.state in _STATE_CODES:
        code, message = _STATE_CODES[booking.state]
        raise ItoError(code, message)
    if now >= booking.ends_at:
        raise ItoError(ErrorCode.BOOKING_EXPIRED, "the booking has expired")
    if require_started and now < booking.starts_at:
        starts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(booking.starts_at))
        raise ItoError(ErrorCode.BOOKING_NOT_STARTED, f"the booking's window has not begun: it starts at {starts}")
    return Eligibility(
        account_id=account_id, booking_id=booking.booking_id, booking_revision=booking.revision,
        gpu_type=booking.gpu_type, num_gpus=booking.num_gpus, num_nodes=booking.num_nodes,
        topology=booking.topology, region=booking.region, network=booking.network,
        starts_at=booking.starts_at, ends_at=booking.ends_at, duration_s=booking.duration_s,
    )


def _bound(bound_json: str | None) -> dict:
    if bound_json is None:
        raise ItoError(ErrorCode.BOOKING_MISMATCH, "the confirmation is not bound to this booking")
    return json.loads(bound_json)


def require_same_network(bound_json: str | None, current: Eligibility) -> None:
    """The region and network a confirmation was computed against still hold (NETWORK_MISMATCH)."""
    bound, now = _bound(bound_json), current.to_dict()
    if any(bound.get(name) != now[name] for name in _NETWORK_FIELDS):
        raise ItoError(ErrorCode.NETWORK_MISMATCH, "the booking's region or network changed since confirmation")


def require_unchanged(bound_json: str | None, current: Eligibility) -> None:
    """The eligibility a confirmation was computed against must still hold, field for field.

    A region or network change is NETWORK_MISMATCH; any other amendment (topology, window,
    price: the revision moves) is BOOKING_MISMATCH.
    """
    require_same_network(bound_json, current)
    if _bound(bound_json) != current.to_dict():
        raise ItoError(ErrorCode.BOOKING_MISMATCH, "the booking was amended since confirmation")
