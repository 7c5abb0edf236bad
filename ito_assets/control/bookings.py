"""Bookings: the booked blocks of GPU compute, administered by the desk.

A booking is the first gate's evidence (entitlement); only the desk changes one.
Every amendment bumps `revision`, which invalidates each eligibility and pending confirmation
computed against an earlier revision (they carry the revision they saw).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, ids
from ito_assets.control.ledger import Ledger, accounts, bookings
from ito_assets.control.states import BookingState

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}$")
AMENDABLE = ("region", "network", "topology", "starts_at", "ends_at", "price_per_gpu_hour_cents")

# Which state changes the desk may make; "expired" follows from the clock, not from the desk.
_TRANSITIONS = {
    "complete": ({BookingState.PENDING}, BookingState.COMPLETED),
    "revoke": ({BookingState.PENDING, BookingState.COMPLETED}, BookingState.REVOKED),
    "release": ({BookingState.COMPLETED}, BookingState.RELEASED),
}


@dataclass(frozen=True, kw_only=True)
class BookingTerms:
    """What the desk sold: validated on construction, with the field named in the error."""

    gpu_type: str
    num_gpus: int
    num_nodes: int
    topology: str
    region: str
    network: str
    starts_at: int
    ends_at: int
    price_per_gpu_hour_cents: int

    def __post_init__(self) -> None:
        for name in ("gpu_type", "topology", "region", "network"):
            if not isinstance(getattr(self, name), str) or not _LABEL.fullmatch(getattr(self, name)):
                raise ItoError(ErrorCode.USAGE_ERROR, f"booking field '{name}' must be a short label")
        for name in ("num_gpus", "num_nodes", "price_per_gpu_hour_cents", "starts_at", "ends_at"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ItoError(ErrorCode.USAGE_ERROR, f"booking field '{name}' must be a positive integer")
        if self.num_gpus % self.num_nodes:
            raise ItoError(ErrorCode.USAGE_ERROR, "booking field 'num_gpus' must divide evenly over num_nodes")
        if self.ends_at <= self.starts_at:
            raise ItoError(ErrorCode.USAGE_ERROR, "booking field 'ends_at' must be after starts_at")


@dataclass(frozen=True, kw_only=True)
class Booking(BookingTerms):
    booking_id: str
    account_id: str
    state: BookingState
    revision: int
    created_at: int
    updated_at: int

    @property
    def duration_s(self) -> int:
        return self.ends_at - self.starts_at

    def to_dict(self) -> dict:
        return {**asdict(self), "state": self.state.value, "duration_s": self.duration_s}


def _from_row(row) -> Booking:
    names = {f.name for f in fields(Booking)}
    values = {k: v for k, v in dict(row).items() if k in names}
    return Booking(**{**values, "state": BookingState(values["state"])})


def load(conn: sa.Connection, booking_id: str, *, for_update: bool = False) -> Booking | None:
    query = sa.select(bookings).where(bookings.c.booking_id == booking_id)
    row = conn.execute(query.with_for_update() if for_update else query).mappings().first()
    return None if row is None else _from_row(row)


def get(ledger: Ledger, booking_id: str) -> Booking | None:
    with ledger.read() as conn:
        return load(conn, booking_id)


def list_for(ledger: Ledger, account_id: str | None = None) -> list[Booking]:
    """Every booking, or one account's (ACCOUNT_NOT_FOUND for an id that names no account: an
    empty list would read as an account that has none)."""
    query = sa.select(bookings).order_by(bookings.c.created_at, bookings.c.booking_id)
    with ledger.read() as conn:
        if account_id is not None:
            require_account(conn, account_id)
            query = query.where(bookings.c.account_id == account_id)
        return [_from_row(r) for r in conn.execute(query).mappings().all()]


def account_exists(conn: sa.Connection, account_id: str) -> bool:
    return conn.execute(sa.select(accounts.c.account_id).where(accounts.c.account_id == account_id)).first() is not None


def require_account(conn: sa.Connection, account_id: str) -> None:
    """ACCOUNT_NOT_FOUND unless the account exists (the message never echoes the id asked for)."""
    if not account_exists(conn, account_id):
        raise ItoError(ErrorCode.ACCOUNT_NOT_FOUND, "no such account")


def create(ledger: Ledger, account_id: str, terms: BookingTerms, *, actor: str | None) -> Booking:
    now = ledger.now()
    booking = Booking(**asdict(terms), booking_id=ids.new_id("bkg"), account_id=account_id,
                      state=BookingState.PENDING, revision=1, created_at=now, updated_at=now)
    with ledger.write() as conn:
        if not account_exists(conn, account_id):
            raise ItoError(ErrorCode.USAGE_ERROR, "no such account")
        conn.execute(bookings.insert().values(**{**asdict(booking), "state": booking.state.value}))
        audit.record(conn, now, "booking_created", actor=actor, account_id=account_id,
                     subject=booking.booking_id, **asdict(terms))
    return booking


def _must_load(conn: sa.Connection, booking_id: str) -> Booking:
    booking = load(conn, booking_id, for_update=True)
    if booking is None:
        raise ItoError(ErrorCode.BOOKING_NOT_FOUND, "no such booking")
    return booking


def transition(ledger: Ledger, booking_id: str, verb: str, *, actor: str | None) -> Booking:
    """complete, revoke or release a booking (the desk's economic actions)."""
    allowed_from, target = _TRANSITIONS[verb]
    now = ledger.now()
    with ledger.write() as conn:
        booking = _must_load(conn, booking_id)
        if booking.state not in allowed_from:
            code = {BookingState.REVOKED: ErrorCode.BOOKING_REVOKED, BookingState.RELEASED: ErrorCode.BOOKING_RELEASED,
                    BookingState.EXPIRED: ErrorCode.BOOKING_EXPIRED}.get(booking.state, ErrorCode.BOOKING_INCOMPLETE)
            raise ItoError(code, f"a {booking.state.value} booking cannot be {verb}d")
        conn.execute(bookings.update().where(bookings.c.booking_id == booking_id)
                     .values(state=target.value, updated_at=now))
        audit.record(conn, now, f"booking_{target.value}", actor=actor, account_id=booking.account_id,
                     subject=booking_id, previous_state=booking.state.value)
    return _replace(booking, state=target, updated_at=now)


def amend(ledger: Ledger, booking_id: str, changes: dict, *, actor: str | None) -> Booking:
    """Change the terms and bump the revision: earlier eligibilities and confirmations no longer match."""
    unknown = set(changes) - set(AMENDABLE)
    if unknown or not changes:
        raise ItoError(ErrorCode.USAGE_ERROR, f"an amendment changes one or more of: {', '.join(AMENDABLE)}")
    now = ledger.now()
    with ledger.write() as conn:
        booking = _must_load(conn, booking_id)
        if booking.state not in (BookingState.PENDING, BookingState.COMPLETED):
            raise ItoError(ErrorCode.USAGE_ERROR, f"a {booking.state.value} booking cannot be amended")
        terms = {f.name: getattr(booking, f.name) for f in fields(BookingTerms)}
        BookingTerms(**{**terms, **changes})  # validates the amended terms as a whole
        values = {**changes, "revision": booking.revision + 1, "updated_at": now}
        conn.execute(bookings.update().where(bookings.c.booking_id == booking_id).values(**values))
        audit.record(conn, now, "booking_amended", actor=actor, account_id=booking.account_id,
                     subject=booking_id, revision=booking.revision + 1, **changes)
    return _replace(booking, **values)


def _replace(booking: Booking, **changes) -> Booking:
    return Booking(**{**{f.name: getattr(booking, f.name) for f in fields(Booking)}, **changes})
