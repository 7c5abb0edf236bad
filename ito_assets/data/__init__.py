"""Data preparation, pure core (no Dagster): sources -> shards -> exact and near-duplicate removal
-> decontamination against the eval suite -> clean shards, with the lineage an auditor follows.

Modules, in pipeline order: config, text, sources, shards, exact_dedup, minhash, near_dedup,
dedup, eval_index, decontam, clean, lineage (the warehouse's tables and audit queries) and
warehouse (the DuckDB file, its journal and its rebuild); `stages` runs them per manifest for the
shell.
The stages run deduplication and decontamination over byte-sized work units (units, scratch):
dedup_units with band_join, and decontam_units; their results equal the in-memory steps exactly.
"""
