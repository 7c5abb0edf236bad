"""Accounts and identity tokens. Authentication is identity, not workload authority:
a token says who is calling; only a consumed confirmation authorizes a mutation."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, ids
from ito_assets.control.ledger import Ledger, accounts, tokens
from ito_assets.control.states import Role


@dataclass(frozen=True)
class Identity:
    token_id: str
    role: Role
    account_id: str | None  # None for desk tokens

    def require_role(self, role: Role) -> None:
        if self.role is not role:
            raise ItoError(ErrorCode.PERMISSION_DENIED, f"this operation needs a {role.value} identity")

    @property
    def tenant(self) -> str:
        if self.role is not Role.ACCOUNT or self.account_id is None:
            raise ItoError(ErrorCode.PERMISSION_DENIED, "this operation needs an account identity")
        return self.account_id


@dataclass(frozen=True)
class Account:
    account_id: str
    name: str
    created_at: int


@dataclass(frozen=True)
class IssuedToken:
    """The one moment a token exists in clear: handed to the caller, who writes it to a 0600 file."""

    token_id: str
    role: Role
    account_id: str | None
    secret: str

    def __repr__(self) -> str:  # never let a log line or traceback print the secret
        return f"IssuedToken(token_id={self.token_id!r}, role={self.role.value!r}, account_id={self.account_id!r})"


def authenticate(ledger: Ledger, presented: str | None) -> Identity:
    """Hash the presented token and look it up. No token, or not a token's shape -> AUTH_REQUIRED;
    a well-formed token the ledger does not accept (unknown or revoked) -> CREDENTIAL_REVOKED: the
    caller must get a new one, and an unknown token is told apart from a revoked one by nobody but
    the desk. The comparison is on the hash by an indexed equality lookup, so timing
    reveals nothing about any stored token."""
    if not presented or ids.TOKEN.fullmatch(presented) is None:
        raise ItoError(ErrorCode.AUTH_REQUIRED, "a valid identity token is required")
    with ledger.read() as conn:
        row = conn.execute(sa.select(tokens).where(tokens.c.token_hash == ids.secret_hash(presented))).mappings().first()
    if row is None or row["revoked_at"] is not None:
        raise ItoError(ErrorCode.CREDENTIAL_REVOKED, "the identity token is unknown or was revoked")
    return Identity(token_id=row["token_id"], role=Role(row["role"]), account_id=row["account_id"])


def create_account(ledger: Ledger, name: str, *, actor: str | None) -> Account:
    now = ledger.now()
    account = Account(account_id=ids.new_id("acc"), name=name, created_at=now)
    with ledger.write() as conn:
        taken = conn.execute(sa.select(accounts.c.account_id).where(accounts.c.name == name)).first()
        if taken is not None:
            raise ItoError(ErrorCode.USAGE_ERROR, "an account with this name already exists")
        conn.execute(accounts.insert().values(account_id=account.account_id, name=name, created_at=now))
        audit.record(conn, now, "account_created", actor=actor, account_id=account.account_id,
                     subject=account.account_id)
    return account


def list_accounts(ledger: Ledger) -> list[Account]:
    with ledger.read() as conn:
        rows = conn.execute(sa.select(accounts).order_by(accounts.c.created_at, accounts.c.name)).mappings().all()
    return [Account(**row) for row in rows]


def issue_token(ledger: Ledger, role: Role, *, account_id: str | None, label: str,
                actor: str | None) -> IssuedToken:
    if (role is Role.ACCOUNT) != (account_id is not None):
        raise ItoError(ErrorCode.USAGE_ERROR, "account tokens need an account; desk tokens have none")
    secret = ids.new_token(role.value)
    token_id = ids.new_id("tok")
    now = ledger.now()
    with ledger.write() as conn:
        if account_id is not None:
            exists = conn.execute(sa.select(accounts.c.account_id).where(accounts.c.account_id == account_id)).first()
            if exists is None:
                raise ItoError(ErrorCode.USAGE_ERROR, "no such account")
        conn.execute(tokens.insert().values(
            token_id=token_id, token_hash=ids.secret_hash(secret), role=role.value, account_id=account_id,
            label=label, created_at=now, created_by=actor,
        ))
        audit.record(conn, now, "token_issued", actor=actor, account_id=account_id, subject=token_id,
                     role=role.value)
    return IssuedToken(token_id=token_id, role=role, account_id=account_id, secret=secret)


def revoke_token(ledger: Ledger, token_id: str, *, actor: str | None) -> bool:
    """Revoke by id (never by value). True when this call revoked it, False when it already was."""
    now = ledger.now()
    with ledger.write() as conn:
        row = conn.execute(sa.select(tokens.c.account_id).where(tokens.c.token_id == token_id)).first()
        if row is None:
            raise ItoError(ErrorCode.USAGE_ERROR, "no such token")
        changed = conn.execute(
            tokens.update().where(tokens.c.token_id == token_id, tokens.c.revoked_at.is_(None)).values(revoked_at=now)
        ).rowcount
        if changed:
            audit.record(conn, now, "token_revoked", actor=actor, account_id=row.account_id, subject=token_id)
    return bool(changed)
