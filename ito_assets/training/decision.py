"""The decision job, before any compute is booked: is the candidate mixture worth a training block?

A proxy model is trained on the candidate mixture and on a baseline mixture with the same token
budget, the same seeds (paired: seed s gives both arms the same initial weights and the same
batch order over their own tokens) and one tokenizer fitted on equal bytes of both, then scored on
the eval battery. The verdict is a paired test over seeds (verdict.py): GO or NO_GO only
when the 95% confidence interval of the per-seed difference excludes zero, WITHIN_NOISE when it
does not, INCONCLUSIVE with a single seed or seeds that changed neither arm, where the noise is
not measured, or with a proxy whose training diverged. When the manifest asks
for a minimum detectable effect, the configured seeds are a pilot and their spread sets how many
seeds are trained in all (Stein's two-stage test, verdict.py).

DataDecide (Magnusson et al. 2025) is the method: a single small scale, several seeds, and
continuous metrics (here: the answer's bits per byte) decide better than accuracy at small compute.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

import numpy as np

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalItem
from ito_assets.manifest.schema import DecisionPower
from ito_assets.runtime.record.storage import held_alone
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.heldout import SPLIT_SEED, split_heldout
from ito_assets.training.model_config import ModelConfig, config_by_name, parameter_count
from ito_assets.training.tokenizer import (
    LoaderConfig, TokenizerConfig, encode_documents, iterate_batches, open_token_shard, save_tokenizer,
    train_tokenizer, write_token_shard,
)
from ito_assets.training.verdict import PairedTest, Verdict, paired_test, stein_seed_count, stein_test, withheld

# The training and the eval battery need torch; they are imported where a decision runs, so that
# its configuration and result types (the Dagster parameters, the economics, the gate) do not.
if TYPE_CHECKING:
    from ito_assets.training.evaluation import EvalReport
    from ito_assets.training.model import DecoderLM
    from ito_assets.training.trainer import TrainConfig, TrainResult

ARMS = ("candidate", "baseline")
LOCK_NAME = ".decision.lock"  # in the work folder: held while a decision runs there
# Lower is better for bits per byte; the band and the verdict use this metric.
PRIMARY_METRIC = "answer_bits_per_byte"


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


# The proxy the decision is specified at: a 150M model, a scale at which DataDecide (Magnusson et
# al. 2025) ranks data recipes to predict the winner at 1B; smaller models are stand-ins for it.
PROXY_MODEL = "proxy-150m"

@dataclass(frozen=True, kw_only=True)
class DecisionConfig:
    # The embedded default runs `tiny` on CPU; a booked cluster runs `proxy-150m` (same code).
    model_name: str = "tiny"
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    # Three seeds, as DataDecide trains at every scale: two leave the paired test one degree of
    # freedom (a 95% interval of +-12.7 standard errors), which decides almost nothing.
    seeds: tuple[int, ...] = (0, 1, 2)
    # 32 steps x 16 x 128 = 65,536 tokens per run: the six runs and their evals take about a
    # minute and a half on two CPU cores (benchmarks/decision_run.py); a proxy-150m decision on a booking
    # uses DataDecide's budget instead (100 tokens per parameter, Magnusson et al. 2025).
    num_steps: int = 32
    batch_size: int = 16
    sequence_length: int = 128
    learning_rate: float = 3e-3
    eval: EvalConfig = field(default_factory=EvalConfig)
    # The paired test's two-sided confidence: a false GO or NO_GO in at most 5% of decisions
    # between arms that do not differ (benchmarks/decision_rule.py measures it).
    confidence: float = 0.95
    # 5% of each arm's documents are held out for its bits per byte (reported, not decisive).
    heldout_fraction: float = 0.05
    # The manifest's `decision_power`: the difference (bits per byte) the decision must be able to
    # detect with 80% power. Set, `seeds` are Stein's pilot and the data choose how many more to
    # train, up to `max_seeds` (verdict.stein_seed_count); None: exactly `seeds`.
    target_detectable_effect: float | None = None
    max_seeds: int = 12

    def __post_init__(self) -> None:
        config_by_name(self.model_name)
        _require(len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds), "seeds", "must be distinct and non-empty")
        for name in ("num_steps", "batch_size", "sequence_length"):
            _require(getattr(self, name) >= 1, name, "must be positive")
        _require(0 < self.learning_rate < float("inf"), "learning_rate", "must be positive and finite")
        _require(0.5 <= self.confidence < 1, "confidence", "must be in [0.5, 1)")
        _require(0 <= self.heldout_fraction < 0.5, "heldout_fraction", "must be in [0, 0.5)")
        if self.target_detectable_effect is not None:
            _require(self.target_detectable_effect > 0, "target_detectable_effect", "must be positive")
            _require(len(self.seeds) >= 2, "seeds", "must hold a pilot of two or more when a detectable effect is set")
            _require(self.max_seeds >= len(self.seeds), "max_seeds", "must be at least the number of pilot seeds")

    def with_power(self, power: DecisionPower | None) -> DecisionConfig:
        """This configuration under the manifest's `decision_power`, when it sets one."""
        if power is None:
            return self
        return replace(self, target_detectable_effect=power.minimum_detectable_effect,
                       max_seeds=max(power.max_seeds, len(self.seeds)))

    def extra_seeds(self, count: int) -> tuple[int, ...]:
        """`count` seeds after the pilot's, none of them the pilot's."""
        return tuple(range(max(self.seeds) + 1, max(self.seeds) + 1 + count))

    @property
    def num_tokens_per_run(self) -> int:
        return self.num_steps * self.batch_size * self.sequence_length

    def train_config(self, seed: int) -> TrainConfig:
        from ito_assets.training.trainer import TrainConfig

        return TrainConfig(num_steps=self.num_steps, batch_size=self.batch_size, sequence_length=self.sequence_length,
                           seed=seed, learning_rate=self.learning_rate)


@dataclass(frozen=True, kw_only=True)
class ArmRun:
    arm: str
    seed: int
    train: TrainResult
    report: EvalReport
    heldout_bits_per_byte: float | None

    @property
    def primary(self) -> float:
        return self.report.metric("bits_per_byte")


@dataclass(frozen=True, kw_only=True)
class ArmSummary:
    arm: str
    num_documents: int
    num_tokens_available: int
    mean: float  # of the primary metric over seeds
    stdev: float  # sample standard deviation over seeds (0 with one seed)
    accuracy: float
    correct_prob: float


@dataclass(frozen=True, kw_only=True)
class DecisionResult:
    metric: str
    test: PairedTest
    candidate: ArmSummary
    baseline: ArmSummary
    runs: tuple[ArmRun, ...]
    config: DecisionConfig
    model_name: str
    num_parameters: int
    num_tokens_per_run: int
    tokenizer_sha256: str | None
    train_wall_seconds: float  # training only, all runs
    model_flops: int
    # The sha256 of each clean shard the candidate arm read, in order, where the caller read shards
    # (`decision_run`): training refuses a verdict about other shards. None: texts given directly.
    candidate_shards: tuple[str, ...] | None = None

    @property
    def verdict(self) -> Verdict:
        return self.test.verdict

    @property
    def difference(self) -> float:
        return self.test.difference

    @property
    def half_width(self) -> float | None:
        """The half-width of the paired test's interval (None with one seed)."""
        return self.test.half_width

    @property
    def explanation(self) -> str:
        return self.test.explanation

    @property
    def scale(self) -> str:
        """In plain words, whether this is the 150M-scale decision or a small stand-in for it."""
        if self.model_name == PROXY_MODEL:
            return f"{PROXY_MODEL} ({self.num_parameters:,} parameters): the 150M-scale decision"
        return f"{self.model_name} ({self.num_parameters:,} parameters): a small stand-in, not a 150M decision"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict.value, "metric": self.metric, "lower_is_better": True,
            "difference": self.difference, "half_width": self.half_width, "explanation": self.explanation,
            "test": self.test.to_dict(),
            "candidate": vars(self.candidate), "baseline": vars(self.baseline),
            "model_name": self.model_name, "num_parameters": self.num_parameters, "scale": self.scale,
            "seeds": sorted({r.seed for r in self.runs}), "target_detectable_effect": self.config.target_detectable_effect,
            "num_tokens_per_run": self.num_tokens_per_run, "num_runs": len(self.runs),
            "tokenizer_sha256": self.tokenizer_sha256, "train_wall_seconds": round(self.train_wall_seconds, 3),
            "model_flops": self.model_flops,
            "runs": [{"arm": r.arm, "seed": r.seed, "primary": r.primary, "heldout_bits_per_byte": r.heldout_bits_per_byte,
                      "train": r.train.summary(), "eval": r.report.summary()} for r in self.runs],
        }


# A proxy whose training loss ends more than this above a uniform guess over the vocabulary (ln V
# nats a token; e times its perplexity) has diverged: an untrained model starts just under ln V
# (within 2% for micro and tiny) and a healthy one only goes down, while step-to-step noise near
# the start is about 0.1 nat, so no healthy run comes near it, however short.
DIVERGED_NATS = 1.0


def diverged(train: TrainResult, vocab_size: int) -> bool:
    """Its loss ended (the mean of its last tenth of steps, the finite ones: a step dropped for a
    non-finite loss changed no weight) DIVERGED_NATS above ln(vocab_size), or no step there was finite."""
    tail = train.losses[-max(1, len(train.losses) // 10):]
    finite = [v for v in tail if math.isfinite(v)]
    return not finite or math.fsum(finite) / len(finite) > math.log(vocab_size) + DIVERGED_NATS


def _unless_diverged(test: PairedTest, runs: dict[str, list[ArmRun]], vocab_size: int) -> PairedTest:
    """INCONCLUSIVE where a proxy diverged: as with a metric that is not finite, it says nothing
    about its data, and a diverged baseline whose bits per byte stay finite would make any
    candidate a GO."""
    found = [r for arm in ARMS for r in runs[arm] if diverged(r.train, vocab_size)]
    if not found or test.verdict is Verdict.INCONCLUSIVE:
        return test
    names = ", ".join(f"the {r.arm}'s seed {r.seed}" for r in found)
    return withheld(test, f"training diverged in {names} (its loss ended over {DIVERGED_NATS:g} nat above a "
                          f"uniform guess over the vocabulary, or was not finite); no decision")


def balanced_sample(candidate: Sequence[str], baseline: Sequence[str]) -> list[str]:
    """Documents of both arms, alternating, with each arm contributing about the same number of
    bytes: the tokenizer favours neither arm."""
    budget = min(sum(len(t.encode()) for t in candidate), sum(len(t.encode()) for t in baseline))
    picked: list[str] = []
    for texts in (candidate, baseline):
        used = 0
        for text in texts:
            if used >= budget:
                break
            picked.append(text)
            used += len(text.encode())
    return picked


def _arm_tokens(tokenizer, texts: Sequence[str], work_dir: Path | None, arm: str) -> np.ndarray:
    tokens = encode_documents(tokenizer, texts)
    if work_dir is None:
        return tokens
    shard = write_token_shard(tokens, work_dir / "tokens" / f"{arm}.npy")
    return open_token_shard(Path(shard.path))


def _summarize(arm: str, runs: list[ArmRun], num_documents: int, num_tokens: int) -> ArmSummary:
    values = [r.primary for r in runs]
    return ArmSummary(
        arm=arm, num_documents=num_documents, num_tokens_available=num_tokens,
        # numpy's spread, not statistics.stdev: a diverged run's NaN or inf gives NaN, not a crash.
        mean=statistics.fmean(values), stdev=float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        accuracy=statistics.fmean(r.report.metric("accuracy") for r in runs),
        correct_prob=statistics.fmean(r.report.metric("correct_prob") for r in runs),
    )


class ArmTrainer(Protocol):
    """Trains one arm out of this process (`ito_assets.runtime.stage.proxy_arm.ArmLaunch.train`)."""

    def train(self, *, arm_dir: Path, tokens_path: Path, model_config: ModelConfig,
              config: TrainConfig) -> tuple[DecoderLM, TrainResult]: ...


@contextlib.contextmanager
def _holding(work_dir: Path | None) -> Iterator[None]:
    """`work_dir` for this decision alone while it runs: a second one for the same folder (the
    same manifest's, launched twice) would rewrite its tokens and remove its arms' folders under
    it. STAGE_BUSY, before anything is written, while another holds it."""
    if work_dir is None:
        yield
        return
    work_dir.mkdir(parents=True, exist_ok=True)
    with held_alone(work_dir / LOCK_NAME, lambda: ItoError(
            ErrorCode.STAGE_BUSY, "another decision run for this manifest holds its folder: this one wrote and "
            "trained nothing; run it again once the other ended")):
        yield


def run_decision(
    *, candidate_texts: Sequence[str], baseline_texts: Sequence[str], eval_items: Sequence[EvalItem],
    config: DecisionConfig, work_dir: Path | None = None, trainer: ArmTrainer | None = None,
) -> DecisionResult:
    """Train and evaluate both arms for every seed; `work_dir` keeps the tokenizer and token shards,
    held by this decision alone while it runs. `trainer`: train each arm on the stage worker, in
    `work_dir/arms/<arm>-seed<seed>/`, as the curriculum's stages train; None: in this process,
    with the trainer's own loop."""
    _require(trainer is None or work_dir is not None, "work_dir", "must be given to train on the stage worker")
    with _holding(work_dir):
        return _run_decision(candidate_texts=candidate_texts, baseline_texts=baseline_texts, eval_items=eval_items,
                             config=config, work_dir=work_dir, trainer=trainer)


def _run_decision(
    *, candidate_texts: Sequence[str], baseline_texts: Sequence[str], eval_items: Sequence[EvalItem],
    config: DecisionConfig, work_dir: Path | None, trainer: ArmTrainer | None,
) -> DecisionResult:
    from ito_assets.training.evaluation import evaluate
    from ito_assets.training.model import build_model
    from ito_assets.training.trainer import train

    _require(len(candidate_texts) >= 2 and len(baseline_texts) >= 2, "texts", "must hold at least two documents per arm")
    texts = {"candidate": list(candidate_texts), "baseline": list(baseline_texts)}
    split = {arm: split_heldout(texts[arm], config.heldout_fraction, SPLIT_SEED) for arm in ARMS}
    tokenizer = train_tokenizer(balanced_sample(split["candidate"][0], split["baseline"][0]), config.tokenizer)
    tokenizer_sha = save_tokenizer(tokenizer, work_dir / "tokenizer.json") if work_dir is not None else None
    tokens = {arm: _arm_tokens(tokenizer, split[arm][0], work_dir, arm) for arm in ARMS}
    model_config = config_by_name(config.model_name, vocab_size=tokenizer.get_vocab_size())
    runs: dict[str, list[ArmRun]] = {arm: [] for arm in ARMS}

    def train_seeds(seeds: Sequence[int]) -> None:
        for seed in seeds:
            for arm in ARMS:
                if trainer is not None:
                    model, trained = trainer.train(arm_dir=work_dir / "arms" / f"{arm}-seed{seed}",
                                                   tokens_path=work_dir / "tokens" / f"{arm}.npy",
                                                   model_config=model_config, config=config.train_config(seed))
                else:
                    model = build_model(model_config, seed=seed)
                    loader = iterate_batches(tokens[arm], LoaderConfig(batch_size=config.batch_size,
                                                                       sequence_length=config.sequence_length, seed=seed))
                    trained = train(model, loader, config.train_config(seed))
                report = evaluate(model, tokenizer, eval_items, config.eval, heldout_texts=split[arm][1],
                                  heldout_sequence_length=config.sequence_length)
                runs[arm].append(ArmRun(arm=arm, seed=seed, train=trained, report=report,
                                        heldout_bits_per_byte=report.heldout_bits_per_byte))

    def primaries(arm: str) -> list[float]:
        return [r.primary for r in runs[arm]]

    train_seeds(config.seeds)
    vocab_size = model_config.vocab_size
    test = _unless_diverged(paired_test(primaries("candidate"), primaries("baseline"), config.confidence), runs, vocab_size)
    if config.target_detectable_effect is not None and test.verdict is not Verdict.INCONCLUSIVE:
        pilot = [b - c for c, b in zip(primaries("candidate"), primaries("baseline"))]
        total = stein_seed_count(pilot, config.target_detectable_effect, config.confidence, config.max_seeds)
        train_seeds(config.extra_seeds(total - len(config.seeds)))
        test = _unless_diverged(stein_test(primaries("candidate"), primaries("baseline"), len(config.seeds),
                                           config.confidence), runs, vocab_size)
    all_runs = tuple(runs["candidate"] + runs["baseline"])
    return DecisionResult(
        test=test, metric=PRIMARY_METRIC,
        candidate=_summarize("candidate", runs["candidate"], len(split["candidate"][0]), len(tokens["candidate"])),
        baseline=_summarize("baseline", runs["baseline"], len(split["baseline"][0]), len(tokens["baseline"])),
        runs=all_runs, config=config, model_name=config.model_name, num_parameters=parameter_count(model_config),
        num_tokens_per_run=config.num_tokens_per_run, tokenizer_sha256=tokenizer_sha,
        train_wall_seconds=sum(r.train.wall_seconds for r in all_runs), model_flops=sum(r.train.model_flops for r in all_runs),
    )
