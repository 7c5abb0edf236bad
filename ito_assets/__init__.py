"""ito-training: gated, auditable LLM training runs on booked GPU compute.

Layers (DESIGN.md): pure core packages (manifest, evals, gates, data, training) import no
Dagster; `defs/` is the thin Dagster shell; `api/` is the HTTP server and the `ito` client.
"""
