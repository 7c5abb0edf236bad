"""A step's recorded seconds leave out the wait for a checkpoint's staging copy: that wait is the
checkpoint's blocking time, and counting it in both would make the other badput negative."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from ito_assets.runtime.worker.execution import prepare
from ito_assets.training.layout import Layout
from ito_assets.runtime.worker.main import StageWorker
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.optim import adamw
from ito_assets.training.trainer import TrainConfig

STAGING_WAIT_S = 0.3


class _SlowStager:
    def wait_staged(self) -> float:
        time.sleep(STAGING_WAIT_S)
        return STAGING_WAIT_S


def _worker(checkpointer) -> StageWorker:
    model = build_model(config_by_name("micro"), seed=0)
    worker = object.__new__(StageWorker)  # one step's state only: no process group is needed
    worker.model = model
    worker.execution = prepare(model, Layout(precision="fp32", compile=False, micro_batch_size=2), (),
                               device=torch.device("cpu"), world_size=1)
    worker.optimizer = adamw(model, learning_rate=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    worker.replicas = None
    worker.preference = worker.reinforcement = worker.reference_logprobs = None  # next-token loss
    worker.group = SimpleNamespace(device=torch.device("cpu"))
    worker.train_config = TrainConfig(num_steps=4, batch_size=2, sequence_length=16)
    worker.checkpointer = checkpointer
    worker.next_positions = {}
    worker.config = SimpleNamespace(spike_rewind_steps=2, interval_steps=2)
    worker.heartbeat = SimpleNamespace(beat=lambda *args, **kwargs: None)
    return worker


def _batches(vocab_size: int):
    tokens = torch.randint(0, vocab_size, (2, 17))
    return SimpleNamespace(next_batch=lambda: (1, tokens[:, :-1], tokens[:, 1:]), has_rows=False)


def test_the_staging_wait_is_not_the_steps_time() -> None:
    worker = _worker(_SlowStager())
    started = time.perf_counter()
    result = worker.train_one(1, _batches(config_by_name("micro").vocab_size))
    wall = time.perf_counter() - started
    assert wall >= STAGING_WAIT_S
    assert result.seconds <= wall - STAGING_WAIT_S + 1e-3
