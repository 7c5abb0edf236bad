"""A pretraining chain's result in miniature, written the way the runtime writes it: a byte-level
BPE trained on fixture text (`corpus.prepare`) and a DCP checkpoint folder `step-NNNNNNNNN` with
model, optimizer, train position and generator states, sealed by its completion marker."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from ito_assets.posttraining.bpe import TokenizerRef
from ito_assets.runtime.stage import corpus
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.worker import train_state
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.tokenizer import LoaderConfig, TokenizerConfig, iterate_batches, open_token_shard
from ito_assets.training.trainer import TrainConfig, build_optimizer, train_step

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class Pretrained:
    tokens: corpus.TokenSet
    checkpoint: str

    @property
    def tokenizer(self) -> TokenizerRef:
        return TokenizerRef(path=self.tokens.tokenizer_path, sha256=self.tokens.tokenizer_sha256)


def fixture_texts(names=("stdlib_docstrings", "pydoc_topics", "forum_posts")) -> list[str]:
    texts = []
    for name in names:
        path = ROOT / "data" / "fixtures" / "corpora" / f"{name}.jsonl"
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines()]
    return texts


def make_pretrained(folder: Path, *, model_name: str = "tiny", num_steps: int = 2, batch_size: int = 8,
                    sequence_length: int = 128, texts: list[str] | None = None, seed: int = 0) -> Pretrained:
    tokens = corpus.prepare(texts or fixture_texts(), folder / "tokens", config=TokenizerConfig())
    model = build_model(config_by_name(model_name, vocab_size=tokens.vocab_size), seed=seed)
    config = TrainConfig(num_steps=num_steps, batch_size=batch_size, sequence_length=sequence_length, seed=seed)
    optimizer = build_optimizer(model, config)
    batches = iterate_batches(open_token_shard(Path(tokens.train_path)),
                              LoaderConfig(batch_size=batch_size, sequence_length=sequence_length, seed=seed))
    # One intra-op thread, whatever the caller left: the weights depend on the thread count (the
    # order of float reductions), and a module-scoped fixture runs before the conftest's function-
    # scoped one-thread fixture, with the thread count earlier tests in the process left (a Dagster
    # decision_run sets 1, the default is the core count). Measured: 30 steps with 2 threads vs 1
    # gave different checkpoints, and the chain test's SFT gate margin went -0.008 vs +0.026.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for step in range(num_steps):
            x, y = next(batches)
            train_step(model, optimizer, x, y, step, config)
    finally:
        torch.set_num_threads(threads)
    checkpoint = markers.checkpoint_dir(folder / "long_context", num_steps)
    state = train_state.capture(model, optimizer, step=num_steps, position=num_steps * batch_size, rank=0)
    with warnings.catch_warnings():  # DCP says it writes in one process, as intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.save(state, checkpoint_id=str(checkpoint))
    markers.write_marker(checkpoint, num_steps)
    return Pretrained(tokens=tokens, checkpoint=str(checkpoint))
