"""The smoothed training loss beside the raw batch value (docs/training.md, "The run
directory"): a batch's loss is noisy, and one batch every ``train.log_every`` steps reads as
divergence where the trend is down.

Every record of ``metrics.jsonl`` (and TensorBoard, and the progress bar) carries

- ``train/loss``: the loss of the step's batch (raw, as before);
- ``train/loss_ema``: the exponential moving average of the per-step losses with decay
  :data:`EMA_DECAY`, bias-corrected as Adam's moments (fastai's smoothed loss):
  ``m_t = decay * m_{t-1} + (1 - decay) * loss_t``, ``m_0 = 0``, reported as
  ``m_t / (1 - decay**t)``, so the first step reports its own loss and step ``t`` weighs
  the loss of step ``s`` by ``decay**(t - s)``;
- ``train/loss_mean``: the mean of the per-step losses since the previous record (this step
  included): ``log_every`` losses, each batch counted once.

Its state is part of the checkpoint, so a resumed run records what an uninterrupted one does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Decay of ``train/loss_ema`` per step (about the last 50 steps' weight; fastai's 0.98).
EMA_DECAY = 0.98


@dataclass
class LossSmoother:
    """The running values behind ``train/loss_ema`` and ``train/loss_mean`` (module docstring).

    Example:
        >>> smoother = LossSmoother(decay=0.5)
        >>> smoother.add(4.0)
        {'train/loss_ema': 4.0, 'train/loss_mean': 4.0}
        >>> smoother.add(1.0)  # (0.5 * 0.5 * 4 + 0.5 * 1) / (1 - 0.25)
        {'train/loss_ema': 2.0, 'train/loss_mean': 2.5}
        >>> smoother.recorded()
        >>> smoother.add(3.0)["train/loss_mean"]
        3.0
    """

    decay: float = EMA_DECAY
    moment: float = 0.0  # m_t, before the bias correction
    steps: int = 0
    window_sum: float = 0.0  # losses since the last record
    window_steps: int = 0

    def add(self, loss: float) -> dict[str, float]:
        """Count a step's loss; its smoothed values, to log beside it."""
        self.steps += 1
        self.moment = self.decay * self.moment + (1.0 - self.decay) * loss
        self.window_sum += loss
        self.window_steps += 1
        return {"train/loss_ema": self.moment / (1.0 - self.decay ** self.steps),
                "train/loss_mean": self.window_sum / self.window_steps}

    def recorded(self) -> None:
        """The values were recorded: the next mean starts afresh."""
        self.window_sum, self.window_steps = 0.0, 0

    def state_dict(self) -> dict[str, Any]:
        """Plain values for the checkpoint."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`; None (a checkpoint written before it existed): start
        afresh."""
        fresh = LossSmoother(self.decay)
        for key, value in asdict(fresh).items():
            setattr(self, key, type(value)((state or {}).get(key, value)))


__all__ = ["EMA_DECAY", "LossSmoother"]
