"""Psyche's two derived training figures, confidence and efficiency, from the Trained events.

Psyche's `StatsLogger` (shared/client/src/state/stats.rs) computes both for its metrics
(`psyche_training_confidence`, `psyche_training_efficiency`) and for W&B
(`train/confidence`, `train/efficency`, its spelling):

  confidence = 1 - loss / log2(vocab size)
      how certain the model is whatever its vocabulary: 1 is no loss, 0 is a uniform
      guess, below 0 worse than guessing (Psyche's formula, natural-log loss over a base-2
      entropy, kept as it is so the two implementations' figures compare);
  efficiency = sum(training time) / sum(time between step ends), over the last 16 steps
      the share of the wall clock this client spends training its batch (the rest is
      waiting for the round, witnessing, applying peers' results).

Training time is a step's batch wait plus its train step (Psyche's round_duration runs from
the round's start to the end of training); the time between step ends is measured here,
when each Trained event arrives, as Psyche measures it at each step's end.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from client_image.runtime.events import Trained

WINDOW = 16  # Psyche's BoundedQueue<Duration, 16>


def confidence(loss: float, vocab_size: int) -> float | None:
    """1 - loss / log2(vocab_size); None without a vocabulary (below two tokens) or a loss."""
    if vocab_size < 2 or not math.isfinite(loss):
        return None
    return 1.0 - loss / math.log2(vocab_size)


def model_vocab_size(model: object) -> int | None:
    """The vocabulary of a Hugging Face model (`model.config.vocab_size`), None if it has none."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) and size > 1 else None


class TrainingStats:
    """Follows a client's Trained events; `confidence` and `efficiency` as Psyche has them.

    `vocab_size()` is asked at each step (the model can change between epochs); the clock
    is injectable so a test can give exact step intervals.
    """

    def __init__(self, vocab_size: Callable[[], int | None],
                 clock: Callable[[], float] = time.monotonic):
        self.vocab_size = vocab_size
        self.clock = clock
        self.loss: float | None = None
        self.confidence: float | None = None
        self._train_s: deque[float] = deque(maxlen=WINDOW)
        self._step_s: deque[float] = deque(maxlen=WINDOW)
        self._last_end: float | None = None

    def on_trained(self, event: Trained) -> None:
        now = self.clock()
        if self._last_end is not None:
            self._step_s.append(now - self._last_end)
        self._last_end = now
        self._train_s.append(max(0.0, event.seconds + event.data_wait_s))
        self.loss = event.loss
        self.confidence = confidence(event.loss, self.vocab_size() or 0)

    @property
    def efficiency(self) -> float | None:
        """Training time over wall time of the last steps; None before a second step ends
        (Psyche divides by zero there and reports NaN, which no exporter keeps)."""
        steps = len(self._step_s)
        wall = sum(self._step_s)
        if steps == 0 or wall <= 0.0:
            return None
        # the training times of the same steps as the intervals: the most recent ones
        trained = sum(list(self._train_s)[-steps:])
        return trained / wall
