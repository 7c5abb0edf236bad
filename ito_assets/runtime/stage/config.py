"""What one worker attempt of one stage needs to know, as one JSON document (`--config`).

The supervisor writes a fresh document per attempt (the attempt number, the launch time, the batch
ranges an approved spike proposal skips); everything else is the stage as the Dagster layer
planned it. Paths are absolute; sizes are validated here so that a bad plan fails before torch
starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from ito_assets.runtime.stage.fitting import Fallback
from ito_assets.runtime.supervision.spikes import SpikeConfig
from ito_assets.training.layout import Layout
from ito_assets.training.model_config import ModelConfig, config_by_name

# The heldout evaluation reads at most this many windows: enough for a stable mean on the
# fixture corpora (64 x 128 tokens), bounded so that an eval never dominates a tiny stage.
DEFAULT_EVAL_WINDOWS = 64
# torch's generators take a seed of 64 bits; the signed bound leaves no seed a BIGINT cannot record.
MAX_SEED = 2**63 - 1
# The optimizer settings a stage may set over TrainConfig's pretraining recipe (warmup then cosine,
# AdamW betas (0.9, 0.95), weight decay 0.1, clip 1.0): post-training trains at a constant rate
# with its own betas and no decay (`ito_assets.posttraining.optim.WORKER_RECIPE`).
OPTIMIZER_FIELDS = ("warmup_fraction", "min_lr_ratio", "beta1", "beta2", "weight_decay", "grad_clip")
# What rank 0 writes into the stage folder when the stage has finished: final checkpoint and evals.
RESULT_NAME = "result.json"
# The stage's config as its launch wrote it into the stage folder, which its supervisor reads.
CONFIG_NAME = "stage.json"


@dataclass(frozen=True, kw_only=True)
class PreferenceObjective:
    """DPO instead of next-token loss: the shard's rows are pairs (N, 2, 2, T), chosen then
    rejected, and `reference_path` holds each answer's summed log-probability under the frozen
    reference, (N, 2) float32 in the rows' order (`ito_assets.posttraining.dpo`)."""

    reference_path: str
    beta: float
    label_smoothing: float = 0.0
    rpo_alpha: float = 0.0

    def __post_init__(self) -> None:
        if not Path(self.reference_path).is_absolute():
            raise ValueError("reference_path must be an absolute path")
        if not (math.isfinite(self.beta) and self.beta > 0 and 0 <= self.label_smoothing < 0.5
                and math.isfinite(self.rpo_alpha) and self.rpo_alpha >= 0):
            raise ValueError("beta must be positive, label_smoothing in [0, 0.5) and rpo_alpha finite and >= 0")


@dataclass(frozen=True, kw_only=True)
class ReinforcementObjective:
    """GRPO with DAPO's fixes instead of a shard: a generator process beside the rank samples
    groups of the stage's tasks (`tokens_path` is then their JSONL, `posttraining.tasks.Task`) with
    the newest weights it was sent, and each step trains on `groups_per_step` groups at most
    `max_staleness` versions old, drawing at most `max_draws_per_group` for each
    (`ito_assets.posttraining.rollout_source`). One optimizer step a
    batch: a version is a step."""

    group_size: int
    groups_per_step: int
    max_new_tokens: int
    overlong_cache: int
    clip_eps_low: float
    clip_eps_high: float
    max_staleness: int
    importance_weight_cap: float
    max_draws_per_group: int  # the priced draws (`posttraining.sampling.DrawBudget`)
    sync_every: int = 1  # versions between weight transfers to the generator
    tokenizer_path: str | None = None  # the run's BPE (with its sha256); None: the character vocabulary
    tokenizer_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.tokenizer_path is not None and not Path(self.tokenizer_path).is_absolute():
            raise ValueError("tokenizer_path must be an absolute path")
        if (self.tokenizer_path is None) != (self.tokenizer_sha256 is None):
            raise ValueError("tokenizer_path and tokenizer_sha256 must be set together")
        if (self.group_size < 2 or self.groups_per_step < 1 or self.sync_every < 1 or self.max_staleness < 0
                or self.max_draws_per_group < 1):
            raise ValueError("group_size must be >= 2, groups_per_step, sync_every and max_draws_per_group >= 1, "
                             "max_staleness >= 0")
        if not 0 < self.overlong_cache <= self.max_new_tokens:
            raise ValueError("overlong_cache must be in (0, max_new_tokens]")
        if not (0 <= self.clip_eps_low < 1 and 0 <= self.clip_eps_high and self.importance_weight_cap >= 1):
            raise ValueError("clip_eps_low must be in [0, 1), clip_eps_high >= 0 and importance_weight_cap >= 1")


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    run_key: str
    stage: str
    model: str  # a name of ito_assets.training.model_config.CONFIGS
    vocab_size: int
    tokens_path: str  # .npy token shard (ito_assets.training.tokenizer.write_token_shard), rows, or RLVR's tasks
    heldout_path: str | None  # .npy held-out shard for the stage's eval; None: no eval
    stage_dir: str  # checkpoints, registry, events, proposals of this stage
    heartbeat_dir: str
    metrics_path: str  # JSONL metrics when not launched under Dagster Pipes
    num_steps: int
    batch_size: int  # global, in sequences (the plan's, unless the runtime resource overrides it)
    sequence_length: int
    interval_steps: int  # checkpoint policy
    keep_last: int
    seed: int = 0
    learning_rate: float = 3e-3  # ito_assets.training.trainer.TrainConfig's default for small models
    optimizer: dict[str, float] = field(default_factory=dict)  # over TrainConfig's; keys of OPTIMIZER_FIELDS
    # The plan's layout fitted to this attempt's ranks (`fitting.fit_layout`), over every replica
    # group, and what the fitting changed; the worker applies every field and adds its device's
    # own fallbacks (`ito_assets.runtime.worker.execution`).
    layout: Layout
    layout_fallbacks: tuple[Fallback, ...] = ()
    # Deterministic kernels: a bit-exact resume on GPUs, at some speed; CPU kernels are deterministic anyway.
    deterministic: bool = False
    # The stage's RoPE base and position interpolation (`curriculum.positions`); None: the model's.
    rope_theta: float | None = None
    position_scale: float | None = None
    # The eval suite's items join the stage's eval battery (`stage_eval.battery`) when all three are
    # set: scored with the run's tokenizer, on the suite whose digest the stage was planned with.
    tokenizer_path: str | None = None
    eval_suite_path: str | None = None
    eval_suite_sha256: str | None = None  # "sha256:" + 64 hex, as `ito_assets.evals.suite` digests
    init_from: str | None = None  # the previous stage's final checkpoint
    # With `init_from`: also take its optimizer (moments, step counts, betas and decay), as a
    # continued pretraining stage does. Post-training starts its own AdamW on the weights alone:
    # its recipe's betas and decay would otherwise be the pretraining run's.
    init_optimizer: bool = True
    preference: PreferenceObjective | None = None  # None: next-token loss on windows or rows
    reinforcement: ReinforcementObjective | None = None  # GRPO on generated groups of tokens_path's tasks
    # A planned stop: the attempt ends after this step with a whole checkpoint (the end of a booked
    # window); a later launch resumes from it.
    stop_after_step: int | None = None
    eval_sequence_length: int = 128  # the same for every stage, so that stages compare
    eval_windows: int = DEFAULT_EVAL_WINDOWS
    attempt: int = 0
    launched_at: float = 0.0  # Unix seconds at which the supervisor launched this attempt
    skip_ranges: tuple[tuple[int, int], ...] = ()
    spikes: SpikeConfig = field(default_factory=SpikeConfig)
    # Rewind target of a spike proposal: the newest checkpoint at least this many steps before the
    # spike (PaLM restarted "about 100 steps before the spike", Chowdhery et al. 2022, 5.1).
    spike_rewind_steps: int = 100
    # 10 minutes: a collective blocked longer than this is a hang the supervisor has long since
    # detected (its bound is 5 minutes); NCCL's own default is 10 minutes as well.
    collective_timeout_s: float = 600.0
    # torchft replica groups (`replicas.py`): the stage trains as `replica_groups` copies of this
    # attempt's ranks that average gradients across groups every step and heal a restarted group
    # from its peers. Group 0 alone writes checkpoints, events and the result into `stage_dir`.
    replica_groups: int = 1
    replica_id: int = 0
    # Group i > 0: group 0's stage folder, whose checkpoints it resumes from (it writes none of its
    # own): at or behind group 0's step, on group 0's weights, never from first weights. None: stage_dir.
    resume_dir: str | None = None
    # The other groups' heartbeat folders: a group waits for them before its first quorum (`replica_sync`).
    peer_heartbeat_dirs: tuple[str, ...] = ()
    # torchft's Manager default (60 s) for cross-group collectives, quorum and connections; below
    # the supervisor's hang bound, so a group waiting on a dead peer is never taken for hung itself.
    replica_timeout_s: float = 60.0
    # Which launch wrote this config (`stage.run.prepare`): its supervisor supervises only this
    # config, so that a later launch that rewrote the folder's inputs meanwhile is never run as this one.
    launch_id: str = ""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_steps", "batch_size", "sequence_length", "interval_steps", "keep_last",
                     "eval_sequence_length", "eval_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        for name in ("tokens_path", "stage_dir", "heartbeat_dir", "metrics_path", "tokenizer_path", "eval_suite_path",
                     "resume_dir"):
            if getattr(self, name) is not None and not Path(getattr(self, name)).is_absolute():
                raise ValueError(f"{name} must be an absolute path")
        if not 0 < self.learning_rate < 1:
            raise ValueError("learning_rate must be in (0, 1)")
        unknown = set(self.optimizer) - set(OPTIMIZER_FIELDS)
        if unknown:
            raise ValueError(f"optimizer settings must be among {OPTIMIZER_FIELDS}, not {sorted(unknown)}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                   for v in self.optimizer.values()):
            raise ValueError("optimizer settings must be finite numbers")  # their ranges: TrainConfig's
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must lie in [0, {MAX_SEED}] (torch's generators take 64 bits)")
        if self.attempt < 0 or self.spike_rewind_steps < 0 or self.collective_timeout_s <= 0:
            raise ValueError("attempt and spike_rewind_steps must be >= 0, collective_timeout_s positive")
        if self.replica_groups < 1 or not 0 <= self.replica_id < self.replica_groups:
            raise ValueError("replica_groups must be positive and replica_id lie in [0, replica_groups)")
        if self.batch_size % self.replica_groups or self.replica_timeout_s <= 0:
            raise ValueError("batch_size must be divisible by replica_groups and replica_timeout_s positive")
        if isinstance(self.layout, dict):
            object.__setattr__(self, "layout", Layout.from_dict(self.layout))
        object.__setattr__(self, "layout_fallbacks", tuple(
            f if isinstance(f, Fallback) else Fallback.from_dict(f) for f in self.layout_fallbacks))
        suite = (self.tokenizer_path, self.eval_suite_path, self.eval_suite_sha256)
        if any(v is not None for v in suite) and not all(v is not None for v in suite):
            raise ValueError("tokenizer_path, eval_suite_path and eval_suite_sha256 must be set together")
        object.__setattr__(self, "skip_ranges", tuple((int(a), int(b)) for a, b in self.skip_ranges))
        object.__setattr__(self, "peer_heartbeat_dirs", tuple(self.peer_heartbeat_dirs))
        if isinstance(self.spikes, dict):
            object.__setattr__(self, "spikes", SpikeConfig(**self.spikes))
        if isinstance(self.preference, dict):
            object.__setattr__(self, "preference", PreferenceObjective(**self.preference))
        if isinstance(self.reinforcement, dict):
            object.__setattr__(self, "reinforcement", ReinforcementObjective(**self.reinforcement))
        if self.preference is not None and self.reinforcement is not None:
            raise ValueError("a stage has one objective: preference or reinforcement, not both")
        if self.reinforcement is not None and (self.layout.world_size > 1 or self.replica_groups > 1):
            raise ValueError("reinforcement trains on one rank: its generator serves one trainer")

    def model_config(self) -> ModelConfig:
        """The model's shape with this stage's positions: a stage longer than the model's window (a
        long-context stage) gets rotary tables for its own length. They are buffers, not weights,
        so the checkpoints of shorter and longer stages load into one another."""
        config = config_by_name(self.model, vocab_size=self.vocab_size)
        return replace(config, rope_theta=self.rope_theta or config.rope_theta,
                       rope_position_scale=self.position_scale or config.rope_position_scale,
                       max_seq_len=max(config.max_seq_len, self.sequence_length))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "WorkerConfig":
        body = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = set(body) - known
        if unknown:
            raise ValueError(f"unknown worker config fields: {sorted(unknown)}")
        return cls(**body)

    @classmethod
    def from_argument(cls, argument: str) -> "WorkerConfig":
        """`--config` takes the JSON itself or the path of a file holding it."""
        text = argument if argument.lstrip().startswith("{") else Path(argument).read_text()
        return cls.from_json(text)

    def with_attempt(self, attempt: int, launched_at: float, skip_ranges: tuple[tuple[int, int], ...]) -> "WorkerConfig":
        body = asdict(self) | {"attempt": attempt, "launched_at": launched_at, "skip_ranges": skip_ranges}
        return WorkerConfig(**body)


def group_shape(nnodes: int, nproc_per_node: int, groups: int) -> tuple[int, int] | None:
    """(nodes, ranks per node) of one of `groups` equal replica groups of an attempt: whole nodes
    per group where the nodes split evenly (a group never straddles a node it shares), else the
    ranks of a single node; None where neither splits evenly."""
    if nnodes % groups == 0:
        return nnodes // groups, nproc_per_node
    if nnodes == 1 and nproc_per_node % groups == 0:
        return 1, nproc_per_node // groups
    return None


def launch_of(stage_dir: Path) -> str | None:
    """The launch whose config the stage folder holds now; None where it holds none that reads."""
    try:
        body = json.loads((stage_dir / CONFIG_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    launch = body.get("launch_id") if isinstance(body, dict) else None
    return launch if isinstance(launch, str) else None
