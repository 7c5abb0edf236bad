"""Post-training's knobs as a Dagster resource (key `posttraining`): what the manifest's recipe
does not say. Defaults are the embedded CPU installation's (`PostTrainingRuntime`); the model is
the one the manifest names, from the pretraining chain's checkpoint."""

import dagster as dg

from ito_assets.posttraining.stage import PostTrainingRuntime

_DEFAULT = PostTrainingRuntime()


class PostTrainingResource(dg.ConfigurableResource):
    seed: int = _DEFAULT.seed
    held_out_fraction: float = _DEFAULT.held_out_fraction
    num_eval_prompts: int = _DEFAULT.num_eval_prompts
    batch_size: int = _DEFAULT.batch_size
    rlvr_num_steps: int = _DEFAULT.rlvr_num_steps
    rlvr_groups_per_step: int = _DEFAULT.rlvr_groups_per_step
    max_new_tokens: int = _DEFAULT.max_new_tokens
    overlong_cache: int = _DEFAULT.overlong_cache
    num_threads: int = _DEFAULT.num_threads

    def runtime(self) -> PostTrainingRuntime:
        return PostTrainingRuntime(**self.model_dump())
