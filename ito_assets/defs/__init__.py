"""The Dagster shell: one folder per domain, each exporting its own definitions. Thin: assets
fetch resources and partition keys, call the core, and report metadata."""
