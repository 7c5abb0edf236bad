"""Run configuration of the decision assets (Dagster Config), mapped onto the core's frozen
configuration; the defaults are the core's (`DecisionConfig`, `EconomicsConfig`)."""

from typing import Any, Mapping

import dagster as dg
from pydantic import ValidationError

from ito_assets.settings import DecisionTrainer
from ito_assets.training.decision import DecisionConfig
from ito_assets.training.economics import EconomicsConfig
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.mixtures import DEFAULT_BASELINE_URIS
from ito_assets.training.tokenizer import TokenizerConfig

_DEFAULT = DecisionConfig()


class DecisionRunParams(dg.Config):
    model_name: str = _DEFAULT.model_name
    vocab_size: int = _DEFAULT.tokenizer.vocab_size
    seeds: list[int] = list(_DEFAULT.seeds)
    num_steps: int = _DEFAULT.num_steps
    batch_size: int = _DEFAULT.batch_size
    sequence_length: int = _DEFAULT.sequence_length
    learning_rate: float = _DEFAULT.learning_rate
    num_eval_candidates: int = _DEFAULT.eval.num_candidates
    baseline_uris: list[str] = list(DEFAULT_BASELINE_URIS)
    # 0: torch's default (one thread per core). On a shared machine 1 avoids OpenMP threads
    # spinning against other processes (measured ~6x slower training with 2 threads under load).
    num_threads: int = 0
    # "stage_worker": each arm trains as a curriculum stage does (the supervisor, torchrun, the
    # layout and precision fitted to this host); "in_process": the trainer's own loop in this
    # process (no launch, no restarts), for quick experiments. ITO_DECISION_TRAINER sets the
    # preparation job's default for the whole code location (definitions.py).
    trainer: DecisionTrainer = "stage_worker"

    def to_config(self) -> DecisionConfig:
        return DecisionConfig(
            model_name=self.model_name, tokenizer=TokenizerConfig(vocab_size=self.vocab_size), seeds=tuple(self.seeds),
            num_steps=self.num_steps, batch_size=self.batch_size, sequence_length=self.sequence_length,
            learning_rate=self.learning_rate, eval=EvalConfig(num_candidates=self.num_eval_candidates),
        )


def checked_defaults(fields: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`fields` as defaults of the decision run's config, refused with a ValueError naming `source`
    where a field is not the run config's or a value is out of its range (Dagster would refuse the
    first only when a run is launched, the second only when its step runs)."""
    unknown = sorted(set(fields) - set(DecisionRunParams.model_fields))
    if unknown:
        names = ", ".join(name[:40] for name in unknown[:5])
        raise ValueError(f"{source}: not a field of the decision run's config: {names} "
                         f"(its fields: {', '.join(DecisionRunParams.model_fields)})")
    try:
        DecisionRunParams(**fields).to_config()
    except ValidationError as error:  # the field and the rule, never the value given
        rules = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ValueError(f"{source}: {rules}") from None
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None
    return dict(fields)


class DataDecisionParams(dg.Config):
    max_decision_cost_fraction: float = EconomicsConfig().max_decision_cost_fraction
    min_relative_improvement: float = EconomicsConfig().min_relative_improvement

    def to_config(self) -> EconomicsConfig:
        return EconomicsConfig(max_decision_cost_fraction=self.max_decision_cost_fraction,
                               min_relative_improvement=self.min_relative_improvement)
