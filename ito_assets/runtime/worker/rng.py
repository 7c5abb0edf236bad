"""Random-number-generator state as tensors, so that DCP saves it and a resume is bit-exact.

Three generators matter to a training process: torch's CPU generator (dropout, sampling, init),
numpy's legacy global generator and Python's `random`. Each is stored as integer tensors (no
pickles: a checkpoint loads with `weights_only` semantics). CUDA generators are added when CUDA is
available. Keys carry the rank because every rank's state differs and DCP deduplicates by key.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def capture(rank: int) -> dict[str, torch.Tensor]:
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    assert name == "MT19937", "numpy's legacy global generator is MT19937"
    state = {
        "torch_cpu": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
        "numpy_scalars": torch.tensor([pos, has_gauss], dtype=torch.int64),
        "numpy_cached_gaussian": torch.tensor([cached], dtype=torch.float64),
        "python_words": torch.tensor(words, dtype=torch.int64),
        "python_meta": torch.tensor([version, gauss is not None], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss or 0.0], dtype=torch.float64),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state()
    return {f"rank{rank}.{key}": value for key, value in state.items()}


# What every rank's capture holds; torch_cuda only where CUDA was.
_CPU_KEYS = ("torch_cpu", "numpy_keys", "numpy_scalars", "numpy_cached_gaussian", "python_words", "python_meta",
             "python_gauss")


def restore(rank: int, state: dict[str, torch.Tensor]) -> bool:
    """Set this rank's generators from `state`; False, and left as they are, when `state` holds no
    whole capture of this rank (a checkpoint written by fewer ranks)."""
    mine = {key.split(".", 1)[1]: value for key, value in state.items() if key.startswith(f"rank{rank}.")}
    if not all(key in mine for key in _CPU_KEYS):
        return False
    torch.set_rng_state(mine["torch_cpu"])
    if "torch_cuda" in mine and torch.cuda.is_available():
        torch.cuda.set_rng_state(mine["torch_cuda"])
    pos, has_gauss = (int(v) for v in mine["numpy_scalars"])
    keys = mine["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, pos, has_gauss, float(mine["numpy_cached_gaussian"][0])))
    version, has_python_gauss = (int(v) for v in mine["python_meta"])
    gauss = float(mine["python_gauss"][0]) if has_python_gauss else None
    random.setstate((version, tuple(int(w) for w in mine["python_words"]), gauss))
    return True
