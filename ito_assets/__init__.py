"""ito-training: gated, auditable LLM training runs on booked GPU compute.

Layers: pure core packages (manifest, evals, control, data, training) import no Dagster, so they
run and test without it; `defs/` is the thin Dagster shell; `api/` is the HTTP server and the
`ito` client.
"""
