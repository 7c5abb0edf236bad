"""Training core (no Dagster): tokenizer, model, trainer, eval battery, the data decision, and the
parallelism/precision planner with its memory, throughput and cost models."""
