"""Post-training's knobs as a Dagster resource (key `posttraining`): the seed and the host's
threads, what the manifest does not say (its recipe steps hold the sizes that decide a stage's
compute, its `post_training_eval` the battery's and its held-out split). Defaults are the embedded
CPU installation's (`PostTrainingRuntime`); the model is the one the manifest names, from the
pretraining chain's checkpoint."""

from pydantic import model_validator

from ito_assets.defs.resources import StrictResource
from ito_assets.posttraining.stage import PostTrainingRuntime

_DEFAULT = PostTrainingRuntime()


class PostTrainingResource(StrictResource):
    # `batch_size`, `rlvr_num_steps`, `rlvr_groups_per_step` and `overlong_cache` moved to the
    # recipe, `num_eval_prompts`, `max_new_tokens` and `held_out_fraction` (the evaluation
    # battery's) to the manifest's `post_training_eval`: code that still sets them here is refused
    # (StrictResource), not trained or evaluated with other sizes or prompts than it says.
    seed: int = _DEFAULT.seed
    num_threads: int = _DEFAULT.num_threads

    @model_validator(mode="after")
    def _within_the_runtimes_rules(self) -> "PostTrainingResource":
        try:
            self.runtime()
        except ValueError as error:
            raise ValueError(f"posttraining: {error}") from None
        return self

    def runtime(self) -> PostTrainingRuntime:
        return PostTrainingRuntime(**self.model_dump())
