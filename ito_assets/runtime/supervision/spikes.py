"""A rolling detector of loss and gradient-norm spikes.

A value is a spike when it lies more than `z_threshold` standard deviations above the mean of the
previous `window` values, and at least `min_ratio` times that mean (the ratio keeps a flat,
nearly noise-free curve from flagging tiny wiggles). The statistics exclude the value being
judged and every value already flagged, so a spike cannot hide itself by inflating the variance.

Defaults and their sources:
- window 100 steps: PaLM restarted "about 100 steps before the spike" (Chowdhery et al. 2022,
  section 5.1), so a spike is judged against the same horizon one would rewind over.
- z 6.0: a one-sided Gaussian tail of about 1e-9 per step, fewer than one false alarm over a
  million-step run. Step losses are heavier-tailed than Gaussian, which is why the threshold is
  far above the 3-sigma habit: a merely bad batch must not page the desk.
- min_ratio 1.25: a jump of a quarter of the running mean; the guard on nearly constant series,
  where a tiny standard deviation makes any wiggle a large z-score.
- min_history 20: fewer points give an unstable standard deviation.

`judge_loss` false: only a non-finite loss is flagged, the gradient norm is judged as ever. For
RLVR, whose loss is a policy-gradient surrogate: its value follows the batch's advantages (mean
near 0, either sign), so a "spike" in it is no sign of divergence. Measured: one of 13 RLVR runs on
the worker proposed a restart for a loss of 0.019.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SpikeConfig:
    window: int = 100
    z_threshold: float = 6.0
    min_ratio: float = 1.25
    min_history: int = 20
    judge_loss: bool = True

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError("window must be at least 2")
        if self.z_threshold <= 0:
            raise ValueError("z_threshold must be positive")
        if self.min_ratio < 1:
            raise ValueError("min_ratio must be >= 1")
        if not 2 <= self.min_history <= self.window:
            raise ValueError("min_history must lie in [2, window]")


@dataclass(frozen=True, kw_only=True)
class Spike:
    step: int
    metric: str  # "loss" or "grad_norm"
    value: float
    mean: float
    std: float

    @property
    def z_score(self) -> float:
        return (self.value - self.mean) / self.std if self.std > 0 else math.inf


class RollingDetector:
    """Judges one metric; `observe` returns a Spike or None."""

    def __init__(self, metric: str, config: SpikeConfig, *, judged: bool = True):
        self.metric = metric
        self.config = config
        self.judged = judged  # False: only a non-finite value is a spike
        self._history: deque[float] = deque(maxlen=config.window)

    def history(self) -> list[float]:
        return list(self._history)

    def restore(self, values: list[float]) -> None:
        """`values` as `history` gave them; a non-finite one (never observed into the history) is
        dropped, since a NaN in the window would blind the detector until it leaves the window."""
        self._history.clear()
        finite = [float(v) for v in values if math.isfinite(float(v))]
        self._history.extend(finite[-self.config.window :])

    def observe(self, step: int, value: float) -> Spike | None:
        if not math.isfinite(value):
            return Spike(step=step, metric=self.metric, value=value, mean=math.nan, std=math.nan)
        spike = self._judge(step, value) if self.judged else None
        if spike is None:
            self._history.append(value)
        return spike

    def _judge(self, step: int, value: float) -> Spike | None:
        n = len(self._history)
        if n < self.config.min_history:
            return None
        mean = sum(self._history) / n
        # A product, not `** 2`: a finite value near the float limit (a loss of 1e308) squares to
        # infinity, which judges nothing a spike, where `**` raised OverflowError out of the step.
        std = math.sqrt(sum((v - mean) * (v - mean) for v in self._history) / (n - 1))
        if value > mean + self.config.z_threshold * std and value >= self.config.min_ratio * mean:
            return Spike(step=step, metric=self.metric, value=value, mean=mean, std=std)
        return None


class SpikeDetector:
    """Loss and gradient norm together: the first spike of either at a step is reported."""

    def __init__(self, config: SpikeConfig | None = None):
        config = config or SpikeConfig()
        self.loss = RollingDetector("loss", config, judged=config.judge_loss)
        self.grad_norm = RollingDetector("grad_norm", config)

    def state(self) -> dict[str, list[float]]:
        """The values each metric is judged against: a checkpoint keeps them, so that a resumed
        attempt judges its first steps as the interrupted one would have, not blind for
        `min_history` steps."""
        return {"loss": self.loss.history(), "grad_norm": self.grad_norm.history()}

    def restore(self, state: dict[str, list[float]]) -> None:
        self.loss.restore(state.get("loss", []))
        self.grad_norm.restore(state.get("grad_norm", []))

    def observe(self, step: int, loss: float, grad_norm: float) -> Spike | None:
        loss_spike = self.loss.observe(step, loss)
        grad_spike = self.grad_norm.observe(step, grad_norm)
        return loss_spike or grad_spike
