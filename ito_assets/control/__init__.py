"""The control plane as pure code: the ledger (accounts, identity tokens, bookings, confirmations,
idempotency keys, runs, audit events, budgets) and the five authorization gates that stand between
a request and a training workload (entitlement, manifest digest, single-use bound confirmation,
idempotency key, server-side validation). No Dagster import; the server and the Dagster shell both
call in here.

This package's __init__ stays empty on purpose: the `ito` client imports `control.fingerprint` and
`control.ids` and must not pay for SQLAlchemy at start-up.
"""
