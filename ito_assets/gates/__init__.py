"""The gates of SPEC.md as pure code: the ledger (accounts, identity tokens, bookings,
confirmations, idempotency keys, runs, audit events) and the checks that stand between a request
and a training workload. No Dagster import; the server and the Dagster shell both call in here.

This package's __init__ stays empty on purpose: the `ito` client imports `gates.fingerprint` and
`gates.ids` and must not pay for SQLAlchemy at start-up.
"""
