"""Per-partition load as the periodic rebalance plans on it: a smoothed mean of the items produced per interval, and
how sure that mean is (its standard error), so the balancer can tell a real imbalance from interval noise.

Only the control thread uses a :class:`LoadEstimate`.
"""

from __future__ import annotations

from collections.abc import Sequence

SMOOTHING = 0.25  # weight of the newest interval in the per-partition load the periodic rebalance plans on
WARMUP_SAMPLES = 3  # intervals measured before the first periodic plan


class LoadEstimate:
    """Each partition's load: the mean of the first ``1/alpha`` intervals, then an exponentially weighted mean with
    ``alpha`` for the newest (a real shift shows within a few intervals); and, the same way, the variance of one
    interval's count around that mean. The standard error of the mean follows from both (:meth:`spread`): the
    variance over n for a plain mean, times ``a / (2 - a)`` for an exponentially weighted one. A partition new since
    the last sample starts at its sample, with no spread known yet (taken as its mean: Poisson-like counts)."""

    def __init__(self, alpha: float = SMOOTHING) -> None:
        self.alpha = alpha
        self.samples = 0
        self.mean: list[float] = []
        self.var: list[float] = []

    def add(self, sample: Sequence[int]) -> None:
        """Fold one interval's per-partition counts in."""
        self.samples += 1
        a = max(self.alpha, 1.0 / self.samples)
        mean, var = self.mean, self.var
        for p, x in enumerate(sample):
            if p >= len(mean):
                mean.append(float(x))
                var.append(float(x))
                continue
            d = x - mean[p]
            mean[p] += a * d
            # the weighted variance update (West 1979): exact for the plain mean, the usual EWMA one after it
            var[p] = (1 - a) * (var[p] + a * d * d)

    def spread(self) -> list[float]:
        """The standard error of each partition's mean."""
        a = max(self.alpha, 1.0 / max(1, self.samples))
        factor = a / (2 - a) if a > 1.0 / max(1, self.samples) else 1.0 / max(1, self.samples)
        return [(v * factor) ** 0.5 for v in self.var]

    def rounded(self) -> list[int]:
        """The means as whole items per interval."""
        return [round(x) for x in self.mean]
