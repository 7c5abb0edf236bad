"""The decision job, before any compute is booked: is the candidate mixture worth a training block?

A proxy model is trained on the candidate mixture and on a baseline mixture with the same token
budget, the same seeds (paired: seed s gives both arms the same initial weights and the same
batch order over their own tokens) and one tokenizer fitted on equal bytes of both, then scored on
the eval battery. The verdict is a paired test over seeds (verdict.py): GO or NO_GO only
when the 95% confidence interval of the per-seed difference excludes zero and the interval over
eval items (each item's difference, its mean over seeds) excludes it on the same side,
WITHIN_NOISE when either does not, INCONCLUSIVE with a single seed or seeds that changed neither
arm, where the noise is not measured, with a proxy whose training diverged, or with a benchmark of
fewer than MIN_ITEMS_PER_BENCHMARK items. The rules are one function of the recorded runs
(`decide`), so a stored verdict can be drawn again from its runs (`restated`). When the manifest asks
for a minimum detectable effect, the configured seeds are a pilot and their spread sets how many
seeds are trained in all (Stein's two-stage test, verdict.py).

DataDecide (Magnusson et al. 2025) is the method: a single small scale, several seeds, and
continuous metrics (here: the answer's bits per byte) decide better than accuracy at small compute.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

import numpy as np

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalItem
from ito_assets.runtime.record.storage import held_alone
# DecisionConfig is also found here by the results Dagster pickled before it moved to its module.
from ito_assets.training.decision_config import PROXY_MODEL, DecisionConfig, require
from ito_assets.training.heldout import SPLIT_SEED, split_heldout
from ito_assets.training.model_config import ModelConfig, config_by_name, parameter_count
from ito_assets.training.tokenizer import (
    LoaderConfig, encode_documents, iterate_batches, num_windows, open_token_shard, save_tokenizer,
    train_tokenizer, write_token_shard,
)
from ito_assets.training.verdict import (
    ItemTest, PairedTest, Verdict, over_items, paired_test, stein_seed_count, stein_test, withheld,
)

# The training and the eval battery need torch; they are imported where a decision runs, so that
# its configuration and result types (the Dagster parameters, the economics, the gate) do not.
if TYPE_CHECKING:
    from ito_assets.training.evaluation import EvalReport
    from ito_assets.training.model import DecoderLM
    from ito_assets.training.mixtures import MixtureSource
    from ito_assets.training.trainer import TrainConfig, TrainResult

ARMS = ("candidate", "baseline")
LOCK_NAME = ".decision.lock"  # in the work folder: held while a decision runs there
# Lower is better for bits per byte; the band and the verdict use this metric.
PRIMARY_METRIC = "answer_bits_per_byte"


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
    # What the candidate was measured against: the sha256 of the baseline's texts as the decision
    # read them (`ordered_sha256`), and the files they came from, each with its own sha256, where the
    # caller read files (`decision_run`). None / (): a decision recorded before they were.
    baseline_sha256: str | None = None
    baseline_sources: tuple[MixtureSource, ...] = ()
    # Whether the manifest's reviewers bound those files (its `decision_baseline`), or a run's
    # config named them; None: recorded before it was.
    baseline_bound: bool | None = None
    # The fitted tokenizer's vocabulary, which the divergence rule reads; None: recorded before it
    # was (the requested size is then used, which a fitted vocabulary never exceeds).
    vocab_size: int | None = None
    # Whether the advantage holds over eval items, and each benchmark's number of items (the
    # verdict needs MIN_ITEMS_PER_BENCHMARK of each); None / (): recorded before they were.
    item_test: ItemTest | None = None
    num_items_by_benchmark: tuple[tuple[str, int], ...] = ()
    # This decision's place among the decisions of the same candidate shards: the k-th, after k - 1
    # that were not a GO, tests at confidence 1 - (1 - c) / (k (k - 1)) from the second on
    # (`DecisionConfig.for_attempt`), which `config` holds.
    attempt: int = 1

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
            "model_flops": self.model_flops, "confidence": self.config.confidence, "attempt": self.attempt,
            "baseline_sha256": self.baseline_sha256, "baseline_sources": [vars(b) for b in self.baseline_sources],
            "baseline_bound": self.baseline_bound,
            "item_test": self.item_test.to_dict() if self.item_test else None,
            "num_items_by_benchmark": dict(self.num_items_by_benchmark),
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


def _pilot_test(runs: dict[str, list[ArmRun]], config: DecisionConfig, vocab_size: int) -> PairedTest:
    """The paired test over the configured seeds' runs (Stein's pilot when an effect is set)."""
    pilot = {arm: runs[arm][: len(config.seeds)] for arm in ARMS}
    test = paired_test(*([r.primary for r in pilot[arm]] for arm in ARMS), config.confidence)
    return _unless_diverged(test, pilot, vocab_size)


def seed_test(runs: dict[str, list[ArmRun]], config: DecisionConfig, vocab_size: int) -> PairedTest:
    """The verdict over seeds of every run trained: the pilot's paired test, or Stein's second stage
    over all seeds where an effect is set and the pilot told something."""
    test = _pilot_test(runs, config, vocab_size)
    if config.target_detectable_effect is None or test.verdict is Verdict.INCONCLUSIVE:
        return test
    values = [[r.primary for r in runs[arm]] for arm in ARMS]
    return _unless_diverged(stein_test(*values, len(config.seeds), config.confidence), runs, vocab_size)


def items_by_benchmark(runs: Sequence[ArmRun]) -> tuple[tuple[str, int], ...]:
    """Each benchmark's number of eval items, as the first run scored them."""
    return tuple((b.benchmark, b.num_items) for b in runs[0].report.benchmarks) if runs else ()


def _item_differences(runs: dict[str, list[ArmRun]]) -> list[float] | None:
    """Per item, the mean over seeds of baseline - candidate bits per byte; None where a run kept no
    per-item scores or scored other items than the first."""
    every = runs["candidate"] + runs["baseline"]
    layout = items_by_benchmark(every)
    vectors = {arm: [[v for b in r.report.benchmarks for v in b.item_bits_per_byte] for r in runs[arm]] for arm in ARMS}
    num_items = sum(count for _, count in layout)
    if num_items == 0 or any(items_by_benchmark([r]) != layout for r in every) or \
            any(len(v) != num_items for arm in ARMS for v in vectors[arm]):
        return None
    pairs = list(zip(vectors["candidate"], vectors["baseline"]))
    return [math.fsum(base[i] - cand[i] for cand, base in pairs) / len(pairs) for i in range(num_items)]


def decide(runs: dict[str, list[ArmRun]], config: DecisionConfig, vocab_size: int) -> tuple[PairedTest, ItemTest | None]:
    """The verdict of the runs trained, by today's rules: over seeds, then over items."""
    test = seed_test(runs, config, vocab_size)
    if test.verdict is Verdict.INCONCLUSIVE:
        return test, None
    return over_items(test, items_by_benchmark(runs["candidate"]), _item_differences(runs))


def restated(result: DecisionResult) -> tuple[PairedTest, ItemTest | None]:
    """`result`'s verdict drawn again from its recorded runs with today's rules; INCONCLUSIVE where
    its runs do not pair, seed by seed, from the configured seeds on."""
    runs = {arm: [r for r in result.runs if r.arm == arm] for arm in ARMS}
    seeds = [r.seed for r in runs["candidate"]]
    if seeds != [r.seed for r in runs["baseline"]] or tuple(seeds[: len(result.config.seeds)]) != result.config.seeds:
        return withheld(result.test, "its runs do not pair seed by seed from the configured seeds; no decision"), None
    return decide(runs, result.config, result.vocab_size or result.config.tokenizer.vocab_size)


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
    require(trainer is None or work_dir is not None, "work_dir", "must be given to train on the stage worker")
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

    texts = {"candidate": list(candidate_texts), "baseline": list(baseline_texts)}
    _require_documents(texts)
    split = {arm: split_heldout(texts[arm], config.heldout_fraction, SPLIT_SEED) for arm in ARMS}
    tokenizer = train_tokenizer(balanced_sample(split["candidate"][0], split["baseline"][0]), config.tokenizer)
    tokenizer_sha = save_tokenizer(tokenizer, work_dir / "tokenizer.json") if work_dir is not None else None
    tokens = {arm: _arm_tokens(tokenizer, split[arm][0], work_dir, arm) for arm in ARMS}
    _require_windows(tokens, config)
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

    train_seeds(config.seeds)
    vocab_size = model_config.vocab_size
    pilot = _pilot_test(runs, config, vocab_size)
    if config.target_detectable_effect is not None and pilot.verdict is not Verdict.INCONCLUSIVE:
        differences = [b.primary - c.primary for c, b in zip(runs["candidate"], runs["baseline"])]
        total = stein_seed_count(differences, config.target_detectable_effect, config.confidence, config.max_seeds)
        train_seeds(config.extra_seeds(total - len(config.seeds)))
    test, items = decide(runs, config, vocab_size)
    all_runs = tuple(runs["candidate"] + runs["baseline"])
    return DecisionResult(
        test=test, metric=PRIMARY_METRIC,
        candidate=_summarize("candidate", runs["candidate"], len(split["candidate"][0]), len(tokens["candidate"])),
        baseline=_summarize("baseline", runs["baseline"], len(split["baseline"][0]), len(tokens["baseline"])),
        runs=all_runs, config=config, model_name=config.model_name, num_parameters=parameter_count(model_config),
        num_tokens_per_run=config.num_tokens_per_run, tokenizer_sha256=tokenizer_sha,
        train_wall_seconds=sum(r.train.wall_seconds for r in all_runs), model_flops=sum(r.train.model_flops for r in all_runs),
        baseline_sha256=ordered_sha256(texts["baseline"]), vocab_size=vocab_size, item_test=items,
        num_items_by_benchmark=items_by_benchmark(runs["candidate"]),
    )


# Each arm keeps a document for training when one is held out (heldout.py holds out at least one).
MIN_DOCUMENTS = 2


def _require_documents(texts: dict[str, list[str]]) -> None:
    """SOURCE_INVALID, before the tokenizer is fitted, for an arm of fewer than MIN_DOCUMENTS."""
    for arm in ARMS:
        if len(texts[arm]) < MIN_DOCUMENTS:
            raise ItoError(ErrorCode.SOURCE_INVALID, f"the {arm} mixture holds {len(texts[arm])} document(s); "
                           f"a decision needs at least {MIN_DOCUMENTS} per arm (one is held out)")


def _require_windows(tokens: dict[str, np.ndarray], config: DecisionConfig) -> None:
    """SOURCE_INVALID, before any arm trains, for an arm whose training tokens fill fewer windows
    of sequence_length + 1 tokens than one batch needs."""
    for arm in ARMS:
        windows = num_windows(len(tokens[arm]), config.sequence_length)
        if windows < config.batch_size:
            raise ItoError(ErrorCode.SOURCE_INVALID, f"the {arm} mixture's training text fills {windows} window(s) of "
                           f"{config.sequence_length + 1} tokens; a step needs batch_size = {config.batch_size}: give "
                           "that arm more text, or lower batch_size or sequence_length")


def ordered_sha256(values: Sequence[str]) -> str:
    """The sha256 of strings in order, each as its UTF-8 bytes after its length (no two lists share one)."""
    digest = hashlib.sha256()
    for value in values:
        data = value.encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()
