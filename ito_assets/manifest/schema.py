"""The reviewed manifests: strict pydantic v2 models.

Two kinds share one base. A data manifest (`"kind": "data"`) is the smallest document the data
stage needs: a name, the data references with their digests, licences and decontamination
provenance. A training manifest (`Manifest`, kind "training", the default, so that manifests
reviewed before data manifests existed keep their bytes and digests) adds the model, the training
target, the budget and the checkpoint policy.

Strict mode: integers must be JSON integers (not "8", 8.0 or true); unknown fields are refused at
every level; money is integer US cents and positive. Every number has a range, lower and upper:
a reviewed manifest never carries a value no real run could have (a 4,000-digit budget would
otherwise be approved and priced). Errors from these models are never shown to a caller with
their input (see `verify.py`, which reports field locations, and beside a rule across fields
that one of these models checks, the rule's own words): a validator's message never holds a
value of the document.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ito_assets.digests import DIGEST_REGEX, HEX64_REGEX
from ito_assets.posttraining.tasks import held_out_count

SCHEMA_VERSION = 1
DIGEST_PATTERN = f"^{DIGEST_REGEX}$"
HEX64_PATTERN = f"^{HEX64_REGEX}$"

# Upper bounds, each far above any real run and far below where arithmetic on it gets slow.
MAX_CENTS = 10**15  # ten trillion US dollars
MAX_PARAMETERS = 10**13  # ten trillion parameters
MAX_TOKENS = 10**15  # a quadrillion tokens, over 10x the largest published pretraining corpora
MAX_SEQUENCE_LENGTH = 2**24  # 16M tokens per sequence
MAX_STEPS = 10**9
MAX_KEPT_CHECKPOINTS = 10_000
MAX_EPOCHS = 1_000
MAX_BATCH = 2**20  # pairs or prompt groups per optimizer step
MAX_COMPLETION = 2**16  # tokens a completion may hold (RlvrStep's and PostTrainingEval's max_new_tokens)
MAX_DRAWS_PER_GROUP = 100  # RLVR's draws per trained group: ten times verl's DAPO bound
# Held-out prompts the post-training eval battery may evaluate: its task family holds 10**3
# prompts ("max d1d2d3=", `posttraining.tasks.largest_digit_tasks`), so no held-out split holds more.
MAX_EVAL_PROMPTS = 10**3

Cents = Annotated[int, Field(ge=1, le=MAX_CENTS, description="US dollars in integer cents")]
Parameters = Annotated[int, Field(ge=1, le=MAX_PARAMETERS)]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
SequenceLength = Annotated[int, Field(ge=1, le=MAX_SEQUENCE_LENGTH)]
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_NAME_LENGTH = 128
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, hide_input_in_errors=True)


class Model(_Strict):
    """Which model is trained: a named size, its exact parameter count and a revision."""

    size: Name
    num_parameters: Parameters
    revision: Name


class DecontaminationProvenance(_Strict):
    """Which eval suite the data was decontaminated against, and how."""

    eval_suite_id: Name
    eval_suite_sha256: Annotated[str, Field(pattern=DIGEST_PATTERN)]
    method: Literal["ngram"]
    ngram_size: Annotated[int, Field(ge=4, le=50)] = 13


# A record's field (JSONL) or column (Parquet): printable ASCII without spaces.
FIELD_NAME_PATTERN = r"^[\x21-\x7e]{1,128}$"
FieldName = Annotated[str, Field(pattern=FIELD_NAME_PATTERN)]


SourceUri = Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^(dataroot://|file:///)[^\s]+$")]


class DataReference(_Strict):
    """One source of training documents. `uri` is `dataroot://<relative path>` (the configured
    data root) or `file:///<absolute path>`. `sha256` is over the file's bytes as stored (a
    gzip- or zstd-compressed JSONL file is hashed compressed). Each record's text is in
    `text_field`; its own id, kept as provenance, in `id_field` (absent: the field `id`, where a
    record has one; named: every record must have it)."""

    uri: SourceUri
    sha256: Annotated[str, Field(pattern=HEX64_PATTERN)]
    license: Name
    format: Literal["jsonl", "parquet"]
    text_field: FieldName = "text"
    id_field: FieldName | None = None
    # Optional in the schema so that a missing provenance is reported as PROVENANCE_MISSING
    # (its own gate), not as a generic schema error.
    decontamination: DecontaminationProvenance | None = None


StageName = Literal["pretraining", "mid_training", "long_context"]
STAGE_ORDER: tuple[str, ...] = ("pretraining", "mid_training", "long_context")


class Stage(_Strict):
    name: StageName
    num_tokens: Tokens
    sequence_length: SequenceLength
    # Positions for longer sequences (long-context training): the RoPE base, raised as Llama 3 did
    # (500,000 for 128k context, Dubey et al. 2024, 3.4), and/or position interpolation, positions
    # divided by the factor (Chen et al. 2023). Absent: the previous stage's, else the model's.
    # Optional, so that manifests reviewed before they existed keep their bytes and digests.
    rope_theta: Annotated[float, Field(ge=1, le=1e9)] | None = None
    position_scale: Annotated[float, Field(ge=1, le=64)] | None = None


class EvalGate(_Strict):
    """The stage gates' thresholds, in seed noise bands of each gated metric (the bands themselves
    are measured, not reviewed: `ito_assets.defs.training.resources`). Absent: the runtime's
    defaults, 2 bands each (`ito_assets.runtime.stage.eval_gate`)."""

    # The first stage must beat the untrained model by at least this many bands on every metric.
    min_improvement_bands: Annotated[float, Field(ge=0, le=100)] = 2.0
    # A later stage may fall behind the stage before it by at most this many bands on any metric.
    max_regression_bands: Annotated[float, Field(ge=0, le=100)] = 2.0


class TrainingTarget(_Strict):
    num_tokens: Tokens
    stages: Annotated[tuple[Stage, ...], Field(min_length=1)]
    # Optional, so that manifests reviewed before it existed keep their bytes and digests.
    eval_gate: EvalGate | None = None

    @model_validator(mode="after")
    def _stages_in_order(self) -> "TrainingTarget":
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names) or names != sorted(names, key=STAGE_ORDER.index):
            raise ValueError("stages must be distinct and in curriculum order")
        if sum(s.num_tokens for s in self.stages) != self.num_tokens:
            raise ValueError("stage token counts must add up to num_tokens")
        return self


class SftStep(_Strict):
    kind: Literal["sft"]
    num_epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)] = 1
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 1e-4
    # Pairs per optimizer step. The sizes that decide a stage's compute are the manifest's, so the
    # confirmation binds them; 8 is what stages trained with before the recipe held them.
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 8
    # The instruction pairs (JSONL) bound by uri and sha256. Optional in the schema so that an
    # unbound step is reported as PROVENANCE_MISSING by the stage, not as a generic schema error.
    data: DataReference | None = None


class DpoStep(_Strict):
    kind: Literal["dpo"]
    # beta 0.1 and no label smoothing: the defaults of Rafailov et al. (2023) and TRL's DPOTrainer.
    beta: Annotated[float, Field(gt=0, le=10)] = 0.1
    label_smoothing: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    # The weight of the chosen responses' log-likelihood added to the DPO loss (RPO, Pang et al.
    # 2024; TRL's `rpo_alpha`, which suggests 1.0). 0: plain DPO, as manifests that predate it meant.
    rpo_alpha: Annotated[float, Field(ge=0, le=10)] = 0.0
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 5e-6
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 8  # pairs per optimizer step, as SftStep's
    # The preference pairs (JSONL), bound as SftStep.data is.
    data: DataReference | None = None


class RlvrStep(_Strict):
    kind: Literal["rlvr"]
    group_size: Annotated[int, Field(ge=2, le=1024)] = 8
    # Clip-higher defaults from DAPO (Yu et al., 2025): eps_low 0.2, eps_high 0.28.
    clip_eps_low: Annotated[float, Field(gt=0, lt=1)] = 0.2
    clip_eps_high: Annotated[float, Field(gt=0, lt=1)] = 0.28
    max_staleness: Annotated[int, Field(ge=0, le=64)] = 1
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 1e-6
    # Optimizer steps, and prompts (each a group of `group_size` completions) per step: with the
    # group size, what RLVR generates and trains on, so the confirmation binds them as SftStep's
    # batch_size. 40 x 8: the defaults stages ran with before the recipe held them.
    num_steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 40
    groups_per_step: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 8
    # A completion's length limit L_max (tokens, its eos included) and DAPO's soft overlong window
    # L_cache before it (eq. 13; DAPO: 20,480 and 4,096): how many decoding steps a completion takes
    # and how the reward is shaped, so the confirmation binds them. 8 and 4: what stages ran with
    # before the recipe held them (the battery's answers are one token and eos). At most 2**16: no model the planner knows holds more positions (8,192 at most,
    # `model_config.CONFIGS`); the stage refuses, before any compute, a completion its model cannot
    # hold after the longest prompt (`fixtures.check_completions`). L_max at least 3 and L_cache at
    # most 2**16 - 2: an answer and its eos before a window of one token at least (`_room_for_an_answer`).
    max_new_tokens: Annotated[int, Field(ge=3, le=MAX_COMPLETION)] = 8
    overlong_cache: Annotated[int, Field(ge=1, le=MAX_COMPLETION - 2)] = 4  # and <= max_new_tokens - 2
    # Groups the stage may draw for each group it trains on: DAPO's dynamic sampling draws again
    # for a group whose rewards are all equal (or that is too stale), so this bounds the
    # generation's compute and the plan prices it; the stage never draws more. 10: the bound of
    # the DAPO recipe in verl (`max_num_gen_batches`), what stages ran with before the recipe held it.
    max_draws_per_group: Annotated[int, Field(ge=1, le=MAX_DRAWS_PER_GROUP)] = 10

    # The shortest right completion is an answer and its eos, 2 tokens (the battery's answers are
    # one); a completion longer than L_max - L_cache is penalised as rambling, and one that reaches
    # L_max without eos is truncated (masked out of the loss). With fewer than 2 tokens before the
    # window a right answer and its eos scores no more than a bare eos (with L_max 1 it cannot end
    # at all), so RLVR learns nothing of the answers, or only never to stop.
    @model_validator(mode="after")
    def _room_for_an_answer(self) -> "RlvrStep":
        if self.overlong_cache > self.max_new_tokens:
            raise ValueError("overlong_cache exceeds max_new_tokens")
        if self.max_new_tokens - self.overlong_cache < 2:
            raise ValueError("max_new_tokens - overlong_cache is below 2: an answer and its eos would be "
                             "penalised as overlong")
        return self


class PostTrainingEval(_Strict):
    """The evaluation battery every post-training stage runs on held-out prompts, before (the
    recipe's first stage) and after its training, and whose rewards its eval gate compares. Its
    sizes decide a large share of post-training's compute (each prompt is sampled several times, a
    token a step, on the asset's CPU) and the gate's statistical power, so the
    confirmation binds them. Absent: these defaults, what the stages evaluated with before the
    manifest held them."""

    # 200: every held-out prompt of the battery (a fifth of its 1,000 at the default
    # held_out_fraction), each sampled 8 times (avg@8): the measured paired SE of a stage's gain
    # was ~0.015-0.03, against ~0.03-0.05 with 50 prompts, which left real RLVR gains inside the
    # noise band. More than the held-out split holds is refused with the manifest, before any
    # compute is confirmed, not evaluated on fewer.
    # At least 2: the eval gate compares per-prompt gains, whose spread needs two (one passed the
    # schema, was priced, and failed every stage after its compute). At most 999: one is trained on.
    num_prompts: Annotated[int, Field(ge=2, le=MAX_EVAL_PROMPTS - 1)] = 200
    # The completion length (tokens, its eos included) of the battery's samples and of the KL's:
    # answers are one token and eos, so 8 leaves room for rambling. The stage refuses, before any
    # compute, a length its model cannot hold after the longest prompt (`fixtures.check_completions`).
    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_COMPLETION)] = 8
    # The share of the task family held out (a fixed seeded split): never trained on by RLVR, and
    # where the battery's prompts come from. It decides which prompts RLVR trains on, so the
    # confirmation binds it (it was the `posttraining` resource's until 2026-12-06, with this default).
    # At most 0.999: 999 of the 1,000 prompts; a split holding out all of them would leave RLVR
    # none to train on (from 0.9995 up, as the split rounds).
    held_out_fraction: Annotated[float, Field(gt=0, le=0.999)] = 0.2

    @model_validator(mode="after")
    def _prompts_within_the_held_out_split(self) -> "PostTrainingEval":
        held_out = held_out_count(MAX_EVAL_PROMPTS, self.held_out_fraction)
        if self.num_prompts > held_out:
            raise ValueError(f"num_prompts exceeds the {held_out} held-out prompts that held_out_fraction leaves "
                             f"of the battery's {MAX_EVAL_PROMPTS}")
        return self


PostTrainingStep = Annotated[Union[SftStep, DpoStep, RlvrStep], Field(discriminator="kind")]
POST_TRAINING_ORDER: tuple[str, ...] = ("sft", "dpo", "rlvr")


class Budget(_Strict):
    cap_cents: Cents
    max_incremental_cents: Cents

    @model_validator(mode="after")
    def _increment_within_cap(self) -> "Budget":
        if self.max_incremental_cents > self.cap_cents:
            raise ValueError("max_incremental_cents exceeds cap_cents")
        return self


class CheckpointPolicy(_Strict):
    interval_steps: Steps
    keep_last: Annotated[int, Field(ge=1, le=MAX_KEPT_CHECKPOINTS)]
    storage_uri: Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^(tenant|file)://[^\s]+$")]


class DataDecisionAcceptance(_Strict):
    """A verdict of the 150M decision job that the manifest's reviewers accept in writing (e.g.
    data chosen for licence or coverage reasons whose benefit is within the seed noise, or a GO
    whose gain is small for its cost: NOT_WORTH_IT)."""

    accepted_verdicts: Annotated[tuple[Literal["NO_GO", "WITHIN_NOISE", "INCONCLUSIVE", "NOT_WORTH_IT"], ...],
                                 Field(min_length=1)]
    reason: Annotated[str, Field(min_length=1, max_length=1000)]
    reviewed_by: Name


class BaselineFile(_Strict):
    """A file of the data decision's baseline mixture, the reference the candidate must beat: JSONL
    (a string `text` per line) or Parquet (a `text` column), by its name's ending, bound by the
    sha256 of its bytes as stored."""

    uri: SourceUri
    sha256: Annotated[str, Field(pattern=HEX64_PATTERN)]


# A bound on what one review checks file by file; a larger reference mixture is merged into fewer files first.
MAX_BASELINE_FILES = 64


class DecisionEconomics(_Strict):
    """What a GO must be worth: the full run may cost at most this much per percentage point of
    relative improvement of the decision's metric (bits per byte); dearer is NOT_WORTH_IT."""

    max_cost_cents_per_improvement_point: Cents


class DecisionPower(_Strict):
    """How small a difference the data decision must be able to see (bits per byte, with 80%
    power): its first seeds are a pilot, their spread sets how many it trains, up to `max_seeds`."""

    minimum_detectable_effect: Annotated[float, Field(gt=0, le=10)]  # 10 bits per byte: no text is worse
    # 12: four times DataDecide's three seeds (24 proxy runs); 64 bounds what one decision may spend.
    max_seeds: Annotated[int, Field(ge=2, le=64)] = 12


class DataManifest(_Strict):
    """What the data stage needs and no more: which documents, under which licence, decontaminated
    against which eval suite. Verified like a training manifest (secure read, strict JSON, secret
    scan, schema); it prepares data and can never be trained."""

    schema_version: Literal[1]
    kind: Literal["data"]
    name: Name
    data: Annotated[tuple[DataReference, ...], Field(min_length=1)]

    @field_validator("data")
    @classmethod
    def _distinct_sources(cls, refs: tuple) -> tuple:
        # A document's id derives from its source's digest and row: the same bytes named twice
        # would be every document twice under one id, which no later stage can tell apart.
        for name, values in (("uris", [r.uri for r in refs]), ("sha256 digests", [r.sha256 for r in refs])):
            if len(set(values)) != len(values):
                raise ValueError(f"data references must have distinct {name}")
        return refs


class Manifest(DataManifest):
    """A training manifest: the data manifest's fields, and what a run trains, for how long, at what
    budget and where its checkpoints go."""

    # Absent from every training manifest reviewed before data manifests existed.
    kind: Literal["training"] = "training"
    model: Model
    training_target: TrainingTarget
    post_training: tuple[PostTrainingStep, ...] = ()
    # The post-training eval battery's sizes. A block with defaults, not optional: code reads
    # `manifest.post_training_eval.num_prompts` whether or not the manifest wrote it, and a manifest
    # without it keeps its bytes and digest (the digest is over the bytes, never a re-serialization).
    post_training_eval: PostTrainingEval = PostTrainingEval()
    budget: Budget
    checkpoint_policy: CheckpointPolicy
    data_decision: DataDecisionAcceptance | None = None
    decision_economics: DecisionEconomics | None = None
    decision_power: DecisionPower | None = None
    # What the decision measures the candidate against, reviewed with the rest: a GO against a
    # mixture nobody reviewed (a weak one, chosen in a run's config) would say nothing. Absent:
    # the decision's run config names it, and the decision records that no reviewer bound it.
    decision_baseline: Annotated[tuple[BaselineFile, ...], Field(min_length=1, max_length=MAX_BASELINE_FILES)] | None = None

    @field_validator("decision_baseline")
    @classmethod
    def _distinct_baseline(cls, files: tuple | None) -> tuple | None:
        if files is not None and len({f.uri for f in files}) != len(files):
            raise ValueError("decision_baseline files must have distinct uris")
        return files

    @field_validator("post_training")
    @classmethod
    def _recipe_in_order(cls, steps: tuple) -> tuple:
        kinds = [s.kind for s in steps]
        if len(set(kinds)) != len(kinds) or kinds != sorted(kinds, key=POST_TRAINING_ORDER.index):
            raise ValueError("post_training must be an ordered subset of sft, dpo, rlvr")
        return steps


DATA_KIND = "data"
TRAINING_KIND = "training"


def _words(annotation: object, out: set[str]) -> set[str]:
    """The field names and the literal words (a step's kind, a stage's name) below `annotation`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            out.add(name)
            _words(field.annotation, out)
    elif typing.get_origin(annotation) is Literal:
        out.update(word for word in typing.get_args(annotation) if isinstance(word, str))
    else:
        for argument in typing.get_args(annotation):
            _words(argument, out)
    return out


# Every word the schemas know: what a refusal may show of a location, for it is no caller's text.
SCHEMA_WORDS: frozenset[str] = frozenset(_words(Manifest, set()) | _words(DataManifest, set()))


def _models(annotation: object) -> list[type[BaseModel]]:
    """The models `annotation` holds: itself, a tuple's items, a union's members."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in typing.get_args(annotation) for model in _models(argument)]


def fields_at(schema: type[BaseModel], location: tuple[str | int, ...]) -> frozenset[str]:
    """The fields of the models a validation error's location (JSON mode: field names, item
    indexes, a step's kind) leads to in `schema`."""
    models = [schema]
    for part in location:
        if isinstance(part, int):
            continue  # a tuple's item: its models were taken with the field
        inside = [model for model in models if part in model.model_fields]
        if inside:
            models = [m for model in inside for m in _models(model.model_fields[part].annotation)]
        else:  # a discriminated union's tag: the member whose kind it is
            models = [model for model in models if "kind" in model.model_fields
                      and part in _words(model.model_fields["kind"].annotation, set())]
    return frozenset(name for model in models for name in model.model_fields)


def manifest_kind(document: object) -> str:
    """The kind a parsed JSON document declares: "data" only when it says so; anything else is
    judged as a training manifest (its own schema errors name what is wrong)."""
    return DATA_KIND if isinstance(document, dict) and document.get("kind") == DATA_KIND else TRAINING_KIND


def is_digest_field(path: tuple[str | int, ...], value: str) -> bool:
    """True when `value` sits where the schema expects a digest and has a digest's form.

    The secret scan uses this so that a validated sha256 is never mistaken for a credential.
    """
    if not path:
        return False
    key = path[-1]
    if key == "sha256":
        return re.fullmatch(HEX64_PATTERN, value) is not None
    if key == "eval_suite_sha256":
        return re.fullmatch(DIGEST_PATTERN, value) is not None
    return False
