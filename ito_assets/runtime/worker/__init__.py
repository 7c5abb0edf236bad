"""One rank of one stage attempt (`python -m ito_assets.runtime.worker.main`): process groups
(`distributed`), the plan's layout applied to the model (`execution`), the optimizer step with its
micro-batches (`step`), batches addressed by one integer, the
state a bit-exact resume needs (`train_state`, `rng`), torchft's side of replica groups and where
metrics go (`reporting`)."""
