"""Run configuration of the decision assets (Dagster Config), mapped onto the core's frozen
configuration; the defaults are the core's (`DecisionConfig`, `EconomicsConfig`), and so are the
ranges, each refused by the field's name before any work: seeds in [0, 2**63 - 1] (at most 64),
num_steps in [1, 10**7], batch_size in [1, 4096], sequence_length up to the model's max_seq_len,
vocab_size in [257, 2**17], num_eval_candidates in [2, 16], learning_rate in (0, 1]."""

import re
from typing import Any, Mapping

import dagster as dg
from pydantic import TypeAdapter, ValidationError

from ito_assets.settings import DecisionTrainer
from ito_assets.training.decision_config import DecisionConfig
from ito_assets.training.economics import EconomicsConfig
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.mixtures import DEFAULT_BASELINE_URIS
from ito_assets.training.threads import check_thread_count
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
        check_thread_count(self.num_threads)
        return DecisionConfig(
            model_name=self.model_name, tokenizer=TokenizerConfig(vocab_size=self.vocab_size), seeds=tuple(self.seeds),
            num_steps=self.num_steps, batch_size=self.batch_size, sequence_length=self.sequence_length,
            learning_rate=self.learning_rate, eval=EvalConfig(num_candidates=self.num_eval_candidates),
        )


def checked_defaults(fields: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`fields` as defaults of the decision run's config, refused with a ValueError naming `source`
    where a field is not the run config's, a value is not of its field's type as Dagster's config
    takes it (no "4" for 4, no true for 1), or out of its range; the message names the field, never
    the value. Dagster would refuse the first two only when a run is launched, echoing the value,
    and the last when the step runs."""
    unknown = sorted(set(fields) - set(DecisionRunParams.model_fields))
    if unknown:
        named = [name for name in unknown if _FIELD_NAME.fullmatch(name)]
        others = len(unknown) - len(named)
        listed = ", ".join(named + ([f"{others} more that are no field names"] if others else []))
        raise ValueError(f"{source}: not a field of the decision run's config: {listed} "
                         f"(its fields: {', '.join(DecisionRunParams.model_fields)})")
    for name, value in fields.items():
        try:
            TypeAdapter(DecisionRunParams.model_fields[name].annotation).validate_python(value, strict=True)
        except ValidationError as error:
            raise ValueError(f"{source}: {name}: {error.errors()[0]['msg']}") from None
    if fields.get("num_eval_candidates", 2) < 2:  # the core's rule, under the run config's name
        raise ValueError(f"{source}: num_eval_candidates: must be at least 2")
    # Past here every range is DecisionConfig's (training/decision_config.py), which names the run config's field.
    try:
        DecisionRunParams(**fields).to_config()
    except ValueError as error:  # the core's rule, which names its field and never the value
        raise ValueError(f"{source}: {error}") from None
    return dict(fields)


# A field name as the run config spells them; anything else is not echoed (it could be pasted text).
_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")


class DataDecisionParams(dg.Config):
    max_decision_cost_fraction: float = EconomicsConfig().max_decision_cost_fraction
    min_relative_improvement: float = EconomicsConfig().min_relative_improvement

    def to_config(self) -> EconomicsConfig:
        return EconomicsConfig(max_decision_cost_fraction=self.max_decision_cost_fraction,
                               min_relative_improvement=self.min_relative_improvement)
