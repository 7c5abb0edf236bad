"""A tied weight is saved once and restored tied: the output head shares the embedding's tensor
in the model, so the checkpoint holds it once, under the embedding's name."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ito_assets.runtime.worker import train_state
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.trainer import TrainConfig, build_optimizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
CONFIG = TrainConfig(num_steps=2, batch_size=2, sequence_length=16)


def _trained(seed: int):
    model = build_model(config_by_name("micro"), seed=seed)
    optimizer = build_optimizer(model, CONFIG)
    tokens = torch.randint(0, 512, (2, 17), generator=torch.Generator().manual_seed(seed))
    model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
    optimizer.step()
    return model, optimizer


def test_the_tied_head_is_an_alias_of_the_embedding():
    model, _ = _trained(0)
    assert train_state.tied_aliases(model) == {"head.weight": "embedding.weight"}
    untied = build_model(replace(config_by_name("micro"), tie_embeddings=False), seed=0)
    assert train_state.tied_aliases(untied) == {}


def test_a_checkpoint_holds_the_tied_weight_once_and_restores_it_tied(tmp_path):
    model, optimizer = _trained(0)
    state = train_state.capture(model, optimizer, step=1, position=3, rank=0)
    assert "head.weight" not in state["model"] and "embedding.weight" in state["model"]
    dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    saved = dcp.FileSystemReader(str(tmp_path)).read_metadata().state_dict_metadata
    assert "model.embedding.weight" in saved and not any("head" in key for key in saved)

    fresh, fresh_optimizer = _trained(1)  # other weights, to be overwritten
    template = train_state.template(fresh, fresh_optimizer, rank=0)
    dcp.load(template, checkpoint_id=str(tmp_path), no_dist=True)
    assert train_state.apply(fresh, fresh_optimizer, template, rank=0) == (1, 3, True)
    assert fresh.head.weight is fresh.embedding.weight  # still one tensor
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
