"""The canonical API (HTTP server) and its client `ito`. Calls the core, never Dagster internals."""
