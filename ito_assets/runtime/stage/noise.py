"""The noise band a stage gate judges against, measured for each run.

A gated metric moves between two models for two reasons that are not training: the seed (another
seed would have trained another model) and the eval's own sample (other windows, other items
would have scored differently). The band is their combined standard deviation,
sqrt(seed_band^2 + item_band^2):

- seed_band: the seed-to-seed standard deviation of the metric at the same budget, measured on
  seeds (`defs.training.resources`, the figure and its source); a single run trains one seed, so
  this part is measured once per installation and cited, not re-measured per run.
- item_band: the standard deviation of the difference between the two models' pooled metric over
  bootstrap resamples of the battery's units, the same resample for both models (a paired
  bootstrap: the units both models were scored on are the same, so their shared difficulty
  cancels). Efron and Tibshirani, "An Introduction to the Bootstrap" (1993), ch. 6: 200 resamples
  estimate a standard error; 2,000 keep its second digit stable.

When the reference's units were not recorded (a stage carried forward from an older record), the
item band is the unpaired one, sqrt(2) times the current model's own bootstrap deviation: larger,
never smaller, than the paired one would usually be.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Units:
    """A pooled metric's units: each one's summed loss (nats) and its number of tokens."""

    loss: tuple[float, ...]
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        # Units are read back from a stage's result: a count that does not match, or a unit with no
        # tokens (0/0 in a resample), would make a pooled value or a band that no unit measured.
        if len(self.loss) != len(self.tokens):
            raise ValueError("every unit needs both its loss and its token count")
        if any(t < 1 for t in self.tokens):
            raise ValueError("every unit must score at least one token")

    @property
    def pooled(self) -> float:
        return sum(self.loss) / sum(self.tokens)

    def to_dict(self) -> dict:
        return {"loss": list(self.loss), "tokens": list(self.tokens)}

    @classmethod
    def from_dict(cls, body: dict) -> Units:
        return cls(loss=tuple(float(x) for x in body["loss"]), tokens=tuple(int(x) for x in body["tokens"]))

RESAMPLES = 2000
_SEED = 0  # one fixed resample plan: the same results give the same band, on every host


@dataclass(frozen=True, kw_only=True)
class Band:
    seed_band: float
    item_band: float
    method: str  # "paired bootstrap" or "unpaired bootstrap"

    @property
    def total(self) -> float:
        return math.hypot(self.seed_band, self.item_band)

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def _resampled(units: Units, plan: np.ndarray) -> np.ndarray:
    loss, tokens = np.asarray(units.loss, dtype=np.float64), np.asarray(units.tokens, dtype=np.float64)
    return loss[plan].sum(axis=1) / tokens[plan].sum(axis=1)


def _plan(num_units: int) -> np.ndarray:
    return np.random.default_rng(_SEED).integers(0, num_units, size=(RESAMPLES, num_units))


def band(seed_band: float, current: Units, reference: Units | None) -> Band:
    """The band of one gated metric between `current` and `reference` (None: not recorded)."""
    if not current.loss:
        raise ValueError("a metric with no units has no item noise to measure")
    plan = _plan(len(current.loss))
    if reference is None:
        return Band(seed_band=seed_band, item_band=math.sqrt(2) * float(_resampled(current, plan).std(ddof=1)),
                    method="unpaired bootstrap")
    # The same units score the same tokens under either model: other counts mean other windows or items.
    if tuple(reference.tokens) != tuple(current.tokens):
        raise ValueError("a paired bootstrap needs the same units for both models")
    differences = _resampled(reference, plan) - _resampled(current, plan)
    return Band(seed_band=seed_band, item_band=float(differences.std(ddof=1)), method="paired bootstrap")
