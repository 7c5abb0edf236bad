"""Post-training's knobs as a Dagster resource (key `posttraining`): the evaluation battery's and
the host's, what the manifest's recipe does not say (its steps hold the sizes that decide a
stage's compute). Defaults are the embedded CPU installation's (`PostTrainingRuntime`); the model
is the one the manifest names, from the pretraining chain's checkpoint."""

from ito_assets.defs.resources import StrictResource
from ito_assets.posttraining.stage import PostTrainingRuntime

_DEFAULT = PostTrainingRuntime()


class PostTrainingResource(StrictResource):
    # `batch_size`, `rlvr_num_steps`, `rlvr_groups_per_step` and `overlong_cache` moved to the
    # recipe: code that still sets them here is refused (StrictResource), not trained with other
    # sizes than it says. `max_new_tokens` is now the evaluation battery's completion length only;
    # RLVR generates with the recipe's.
    seed: int = _DEFAULT.seed
    held_out_fraction: float = _DEFAULT.held_out_fraction
    num_eval_prompts: int = _DEFAULT.num_eval_prompts
    max_new_tokens: int = _DEFAULT.max_new_tokens
    num_threads: int = _DEFAULT.num_threads

    def runtime(self) -> PostTrainingRuntime:
        return PostTrainingRuntime(**self.model_dump())
