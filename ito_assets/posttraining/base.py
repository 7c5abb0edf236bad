"""Where post-training starts: the policy's architecture, its text codec and its first weights, as
one frozen record (`PolicySpec`) that every stage hands on to the next.

Two kinds of start:
- pretrained: the pretraining chain's final checkpoint (torch.distributed.checkpoint, written by
  the runtime) with the run's byte-level BPE. What the Dagster stages always use.
- seeded: the `micro` model initialised from the seed with the character vocabulary. What the
  unit tests of the losses and loops use: it learns the battery's task in seconds on CPU.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.bpe import BpeCodec, TokenizerRef
from ito_assets.posttraining.vocab import CharVocab, TextCodec
from ito_assets.training.model_config import ModelConfig, config_by_name

# The model and the checkpoint reader need torch, imported where a policy is built: the spec itself
# is read where torch is not (the post-training assets' start, the code location).
if TYPE_CHECKING:
    from ito_assets.training.model import DecoderLM


@dataclass(frozen=True, kw_only=True)
class CheckpointRef:
    """A checkpoint a stage started from: its path and the sha256 it was verified against before
    loading. A post-training checkpoint's is its file's digest (CheckpointRecord.sha256); a
    pretraining DCP folder's is its `.metadata` file's, the digest its completion marker checks and
    that StageCheckpoint.metadata_sha256 and `ito checkpoints` carry."""

    path: str
    sha256: str

    def as_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256}


@dataclass(frozen=True, kw_only=True)
class PolicySpec:
    model_name: str  # a name of ito_assets.training.model_config.CONFIGS
    vocab_size: int
    seed: int = 0
    tokenizer: TokenizerRef | None = None  # None: the character vocabulary
    init_checkpoint: str | None = None  # a DCP checkpoint folder; None: weights from the seed
    # The RoPE base and position interpolation the weights were trained with (the pretraining
    # chain's last stage, `curriculum.positions`); None: the model's. The rotary tables are buffers,
    # not weights: a checkpoint loads under any, and runs wrong under another than its own.
    rope_theta: float | None = None
    position_scale: float | None = None

    def as_dict(self) -> dict:
        tokenizer = None if self.tokenizer is None else {"path": self.tokenizer.path, "sha256": self.tokenizer.sha256}
        return {"model_name": self.model_name, "vocab_size": self.vocab_size, "seed": self.seed,
                "tokenizer": tokenizer, "init_checkpoint": self.init_checkpoint,
                "rope_theta": self.rope_theta, "position_scale": self.position_scale}

    def model_config(self) -> ModelConfig:
        config = config_by_name(self.model_name, vocab_size=self.vocab_size)
        return dataclasses.replace(config, rope_theta=self.rope_theta or config.rope_theta,
                                   rope_position_scale=self.position_scale or config.rope_position_scale)

    def codec(self) -> TextCodec:
        codec = BpeCodec.load(self.tokenizer) if self.tokenizer is not None else CharVocab()
        if codec.vocab_size > self.vocab_size:
            raise ItoError(ErrorCode.CHECKPOINT_DIGEST_MISMATCH, "the tokenizer is not the one the model was trained with")
        return codec

    def factory(self) -> functools.partial:
        """A picklable builder of the architecture (the generator process builds its own copy)."""
        from ito_assets.training.model import build_model

        return functools.partial(build_model, self.model_config(), seed=self.seed)

    def initial_policy(self) -> DecoderLM:
        policy = self.factory()()
        if self.init_checkpoint is not None:
            load_pretrained(policy, Path(self.init_checkpoint))
        return policy

    def initial_checkpoint(self) -> CheckpointRef | None:
        """The first weights' checkpoint and digest; None: the weights come from the seed."""
        if self.init_checkpoint is None:
            return None
        return CheckpointRef(path=self.init_checkpoint, sha256=pretrained_sha256(Path(self.init_checkpoint)))


# `micro` (2 layers, d_model 32) with the character vocabulary: the configuration that learns the
# battery's task in seconds on CPU (measured: tests/posttraining/test_end_to_end.py).
SMALL_MODEL = "micro"


def seeded(model_name: str = SMALL_MODEL, *, seed: int = 0) -> PolicySpec:
    return PolicySpec(model_name=model_name, vocab_size=CharVocab().vocab_size, seed=seed)


def pretrained(*, model_name: str, vocab_size: int, checkpoint: str, tokenizer: TokenizerRef,
               seed: int = 0, rope_theta: float | None = None, position_scale: float | None = None) -> PolicySpec:
    return PolicySpec(model_name=model_name, vocab_size=vocab_size, seed=seed, tokenizer=tokenizer,
                      init_checkpoint=checkpoint, rope_theta=rope_theta, position_scale=position_scale)


def pretrained_sha256(folder: Path) -> str:
    """The digest a runtime checkpoint folder is named by: its `.metadata` file's sha256 (the one
    its completion marker records; `load_pretrained` refuses a folder whose files no longer match)."""
    from ito_assets.digests import file_sha256
    from ito_assets.runtime.checkpoint.markers import METADATA_NAME

    return file_sha256(folder / METADATA_NAME)


def load_pretrained(policy: DecoderLM, folder: Path) -> DecoderLM:
    """The model weights of a runtime checkpoint (its optimizer, data position and generators are
    the pretraining run's, not ours), after the completion marker's digests are checked."""
    from ito_assets.runtime.worker import train_state

    reason = train_state.load_weights(policy, folder)
    if reason is not None:
        raise ItoError(ErrorCode.CHECKPOINT_DIGEST_MISMATCH,
                       f"the pretraining chain's final checkpoint cannot be used: {reason}")
    return policy
