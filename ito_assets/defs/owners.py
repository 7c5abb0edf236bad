"""Who answers for each asset: one team per part of the lineage, named once here and used by every
asset decorator (Dagster takes an owner as `team:NAME` or an email address). Dagster's asset
checks take no owners (1.13): a check is answered for by its asset's team."""

DATA = "team:data"  # the manifest, the eval suite and data preparation
RESEARCH = "team:research"  # the data decision and the training plan
TRAINING = "team:training"  # the run's authorization, the training stages and post-training
