"""Post-training, after the last pretraining stage: SFT -> DPO -> RLVR (GRPO with the DAPO fixes), generation in a
separate process from training, bounded staleness. Pure core: no Dagster import here."""
