"""The decision job's configuration: the proxy, its seeds and budget, and the ranges each field is
refused outside, by name, before any work (a value past them failed at run time, after the
tokenizer was fitted, or ran for ever)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ito_assets.manifest.schema import DecisionPower
from ito_assets.runtime.stage.config import MAX_SEED
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.model_config import config_by_name
from ito_assets.training.tokenizer import TokenizerConfig

if TYPE_CHECKING:
    from ito_assets.training.trainer import TrainConfig

def require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


# The ranges of the configuration, each refused by name before any work (a value past them failed
# at run time, after the tokenizer was fitted, or ran for ever):
# - seeds: [0, MAX_SEED], the training runtime's (torch's generators take 64 bits, numpy's no
#   negative seed); at most MAX_SEEDS of them, the manifest's bound on `decision_power.max_seeds`.
MAX_SEEDS = 64
# - num_steps: DataDecide's budget for the 150M proxy (100 tokens per parameter, 1.5e10 tokens) is
#   7.3 million steps of the default 16 x 128 batch.
MAX_STEPS = 10**7
# - batch_size: twice the 2,048 sequences of OLMo's 4M-token batch (Groeneveld et al. 2024).
MAX_BATCH_SIZE = 4096
# - sequence_length: the proxy's `max_seq_len` (its rotary table and the eval's window).
# - vocab_size: 2**17 holds every vocabulary the model configs name (Llama 3's 128,256).
MAX_VOCAB_SIZE = 2**17
# - num_eval_candidates: four times the ARC / MMLU format's four; each is a forward per item.
MAX_EVAL_CANDIDATES = 16
# - learning_rate: (0, 1]: AdamW at a rate over 1 moves a weight by more than 1 a step (the
#   proxies here train at 3e-3, OLMo-1B peaks at 4e-4). target_detectable_effect comes from the
#   manifest, which bounds it (`DecisionPower`).


def _within(value: int, low: int, high: int, name: str) -> None:
    require(low <= value <= high, name, f"must lie in [{low}, {high}]")


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
        model = config_by_name(self.model_name)
        require(len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds), "seeds", "must be distinct and non-empty")
        require(len(self.seeds) <= MAX_SEEDS, "seeds", f"must number at most {MAX_SEEDS}")
        require(all(0 <= seed <= MAX_SEED for seed in self.seeds), "seeds", f"must each lie in [0, {MAX_SEED}]")
        for name in ("num_steps", "batch_size", "sequence_length"):
            require(getattr(self, name) >= 1, name, "must be positive")
        _within(self.num_steps, 1, MAX_STEPS, "num_steps")
        _within(self.batch_size, 1, MAX_BATCH_SIZE, "batch_size")
        require(self.sequence_length <= model.max_seq_len, "sequence_length",
                 f"must be at most {model.max_seq_len}, the {self.model_name} model's max_seq_len")
        _within(self.tokenizer.vocab_size, 257, MAX_VOCAB_SIZE, "vocab_size")
        _within(self.eval.num_candidates, 2, MAX_EVAL_CANDIDATES, "num_eval_candidates")
        require(0 < self.learning_rate < float("inf"), "learning_rate", "must be positive and finite")
        require(self.learning_rate <= 1, "learning_rate", "must be at most 1")
        require(0.5 <= self.confidence < 1, "confidence", "must be in [0.5, 1)")
        require(0 <= self.heldout_fraction < 0.5, "heldout_fraction", "must be in [0, 0.5)")
        _within(self.max_seeds, 2, MAX_SEEDS, "max_seeds")
        if self.target_detectable_effect is not None:
            require(0 < self.target_detectable_effect < float("inf"), "target_detectable_effect", "must be positive and finite")
            require(len(self.seeds) >= 2, "seeds", "must hold a pilot of two or more when a detectable effect is set")
            require(self.max_seeds >= len(self.seeds), "max_seeds", "must be at least the number of pilot seeds")
            require(max(self.seeds) + self.max_seeds - len(self.seeds) <= MAX_SEED, "seeds",
                     f"must leave room below {MAX_SEED} for the seeds Stein's second stage adds")

    def with_power(self, power: DecisionPower | None) -> DecisionConfig:
        """This configuration under the manifest's `decision_power`, when it sets one."""
        if power is None:
            return self
        return replace(self, target_detectable_effect=power.minimum_detectable_effect,
                       max_seeds=max(power.max_seeds, len(self.seeds)))

    def for_attempt(self, attempt: int) -> DecisionConfig:
        """This configuration for the `attempt`-th decision about the same candidate, after
        attempt - 1 that were not a GO. Each decision is another chance at a false GO, so the
        k-th tests at confidence 1 - a / (k (k - 1)) from the second on (a = 1 - c): the a's of
        every decision add up to 2a however many are made (1/(k (k - 1)) sums to 1 from k = 2),
        and a two-sided test errs towards GO in half its a at most, so the chance of any false GO
        stays within a. The first decision keeps c; the second tests at 1 - a / 2, as Bonferroni's
        a / k would, and later ones stricter (a / k alone sums to no bound: equal arms decided
        again until GO gave a false GO within 10 decisions in 6.7 % of cases and within 50 in
        9.9 %, this rule 4.3 % and 4.5 %; benchmarks/decision_rule.py --reruns)."""
        require(attempt >= 1, "attempt", "must be at least 1")
        if attempt == 1:
            return self
        return replace(self, confidence=1 - (1 - self.confidence) / (attempt * (attempt - 1)))

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
