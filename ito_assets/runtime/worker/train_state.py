"""Everything a bit-exact resume needs, as one DCP state dict.

    model   parameters (get_state_dict: DDP and FSDP wrappers unwrapped; a tied weight once, under
            its first name, `tied_aliases`)
    optim   AdamW moments and step counts
    train   the step reached and the data-loader position (`batches.ResumableBatches.position`)
    rng     torch, numpy and Python generator states, per rank (`rng.capture`)

`init_from` (the previous stage's final checkpoint) loads only model and optimizer: a new stage
starts its own step count and data order on its own data.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)

from ito_assets.runtime.checkpoint import markers, resume
from ito_assets.runtime.worker import rng


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """alias -> name of parameters that are another's tensor (the tied output head -> the
    embedding): saved once, under the first name, and tied again on load."""
    first: dict[int, str] = {}
    aliases = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            aliases[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return aliases


def _untied(model: nn.Module, weights: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in weights.items() if name not in tied_aliases(model)}


def _tied(model: nn.Module, weights: dict[str, Any]) -> dict[str, Any]:
    """The saved weights under every name the model has: a tied alias gets its tensor's."""
    return {**weights, **{alias: weights[name] for alias, name in tied_aliases(model).items()}}


def weights(model: nn.Module) -> dict[str, Any]:
    """The model's part of a checkpoint (a template for `dcp.load`, or what to save)."""
    return _untied(model, get_model_state_dict(model))


def set_weights(model: nn.Module, saved: dict[str, Any]) -> None:
    """Load the model's part of a checkpoint, tying what was saved once."""
    set_model_state_dict(model, _tied(model, saved))


def load_weights(model: nn.Module, folder: Path, *, owner: dict | None = None, rank: int = 0,
                 group: Any = None) -> str | None:
    """The model weights of the whole checkpoint `folder` into `model`, in this one process (the
    optimizer, data position and generators it also holds belong to the run that wrote it), after
    its marker's digests (and `owner`, when given: `markers.owned_by`) are checked. Returns why it
    cannot be used, or None once loaded. A worker's rank passes its rank and checkpoint group (its
    collectives run on CPU tensors, which a GPU's default group does not take); alone, none."""
    state = {"model": weights(model)}
    with warnings.catch_warnings():  # DCP warns that it loads in one process, as intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        reason = resume.load_checkpoint(folder, state, rank=rank, group=group, owner=owner)
    if reason is None:
        set_weights(model, state["model"])
    return reason


def save_weights(model: nn.Module, parent: Path) -> Path:
    """A checkpoint of `model`'s weights alone, written in this one process as `parent`/step-0 and
    sealed by its marker: a stage's start that no worker wrote (a post-training policy handed on
    in memory), which the worker loads as `init_from`. Written beside and renamed into place, so
    that the folder holds a whole checkpoint or none. Returns the folder."""
    folder = markers.checkpoint_dir(parent, 0)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with warnings.catch_warnings():  # DCP warns that it saves in one process, as intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.save({"model": weights(model)}, checkpoint_id=str(partial))
    markers.write_marker(partial, step=0)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def capture(model: nn.Module, optimizer: torch.optim.Optimizer, *, step: int, position: int, rank: int) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(model, optimizer)
    model_state = _untied(model, model_state)
    return {
        "model": model_state,
        "optim": optim_state,
        "train": {"step": torch.tensor(step, dtype=torch.int64), "position": torch.tensor(position, dtype=torch.int64)},
        "rng": rng.capture(rank),
    }


def template(model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int, weights_only: bool = False) -> dict[str, Any]:
    """A state dict of the right keys and shapes for `dcp.load` to fill in place."""
    state = capture(model, optimizer, step=0, position=0, rank=rank)
    return {"model": state["model"], "optim": state["optim"]} if weights_only else state


def apply(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], *,
          rank: int) -> tuple[int, int, bool]:
    """Load `state` into model, optimizer and generators; returns (step, position, whether this
    rank's generators were in it: not where fewer ranks wrote the checkpoint)."""
    set_state_dict(model, optimizer, model_state_dict=_tied(model, state["model"]), optim_state_dict=state["optim"])
    if "train" not in state:
        return 0, 0, False
    restored = rng.restore(rank, state["rng"])
    return int(state["train"]["step"]), int(state["train"]["position"]), restored


# Parts of the state a checkpoint may lack: a checkpoint written by fewer ranks holds fewer
# generator states, and one written without CUDA none of CUDA's.
OPTIONAL_PARTS = ("rng",)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's unsharded weights on rank 0's CPU (empty on the other ranks). A collective:
    under FSDP2 every rank must call it."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
