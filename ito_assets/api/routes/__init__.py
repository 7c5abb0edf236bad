"""HTTP routes of the canonical API, one module per concept; `common` holds what they share:
the envelope, the status for each error code, authentication and bounded JSON bodies."""
