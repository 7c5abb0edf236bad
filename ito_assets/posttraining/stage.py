"""What a post-training stage is given and what it hands on, apart from the training
(pipeline.py, which needs torch): the settings the manifest does not say (`PostTrainingRuntime`:
the battery's split, the seed, the host's threads), the frozen record of a finished stage
(`StageOutcome`) and where a stage starts (`Start`). The Dagster assets and checks, the ledger
publication and the code location read them without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Union

from ito_assets.runtime.stage.config import MAX_SEED
from ito_assets.posttraining.base import CheckpointRef, PolicySpec
from ito_assets.training.threads import check_thread_count

if TYPE_CHECKING:
    from ito_assets.posttraining.checkpoint import CheckpointRecord
    from ito_assets.posttraining.evaluation import RewardEval
    from ito_assets.posttraining.eval_gate import RewardGateVerdict


@dataclass(frozen=True, kw_only=True)
class PostTrainingRuntime:
    # Seeds data order and sampling (not the battery's split). The battery (3-digit "largest
    # digit" prompts) is the manifest's: how many held-out prompts are evaluated, the completions'
    # length and the share held out (`post_training_eval`, defaults 200, 8 and 0.2: the schema says
    # why), so the confirmation binds them; a Dagster configuration that still sets
    # `num_eval_prompts`, `max_new_tokens` or `held_out_fraction` on the resource is refused.
    seed: int = 0
    # One intra-op thread: for models this small, thread start-up costs more than it saves, and the
    # generator process needs the other core (measured: SFT of 200 steps took 2.3 s of CPU with
    # one thread, 18 s with two on a shared 2-core machine).
    num_threads: int = 1

    def __post_init__(self) -> None:
        check_thread_count(self.num_threads)
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must lie in [0, {MAX_SEED}]")


@dataclass(frozen=True, kw_only=True)
class StageOutcome:
    stage: str
    policy: PolicySpec  # architecture, codec and first weights: every later stage keeps them
    checkpoint: CheckpointRecord
    gate: RewardGateVerdict
    eval_before: RewardEval
    eval_after: RewardEval
    metrics: dict  # JSON-able: curves, staleness histogram, KL to reference
    # What this stage actually loaded (the previous stage's checkpoint, or the pretraining chain's
    # for the first), and the chain's first weights; `policy.init_checkpoint` alone names only the
    # latter, the same on every stage. None: the weights came from the seed (the unit tests' start),
    # or an outcome stored before these were recorded (the class default is what it then reads).
    started_from: CheckpointRef | None = None
    chain_start: CheckpointRef | None = None

    @property
    def stage_dir(self) -> str:
        """The stage's folder: its checkpoint, metrics.json and event log (`timeline`)."""
        return str(PurePath(self.checkpoint.path).parent)

    def start_record(self) -> dict:
        """Where the stage started, as its metrics.json and its asset's metadata record it."""
        return {name: None if ref is None else ref.as_dict()
                for name, ref in (("started_from", self.started_from), ("chain_start", self.chain_start))}


# Where a stage starts: the previous stage's outcome, or (for the first stage of the recipe) the
# base policy. A stage the recipe leaves out hands on what it was given.
Start = Union[StageOutcome, PolicySpec]
