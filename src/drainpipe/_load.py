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
    ``alpha`` for the newest (a real shift shows within a few intervals); and how sure that mean is.

    The spread is estimated on each partition's **share** of the interval's items, not on its count: when producers
    block on full partitions, or an interval runs long, every partition's count rises and falls together, and that
    common swing says nothing about which task carries more. The variance of a share around its mean is tracked
    the same way as the mean; the standard error of the mean share follows (the variance over n for a plain mean,
    times ``a / (2 - a)`` for an exponentially weighted one) and is scaled back to items by the mean total. A
    partition new since the last sample starts at its sample, its variance taken as Poisson-like (its own count)
    until measured."""

    def __init__(self, alpha: float = SMOOTHING) -> None:
        self.alpha = alpha
        self.samples = 0
        self.total = 0.0  # mean items per interval, all partitions
        self.share: list[float] = []
        self.var: list[float] = []  # of the share

    def add(self, sample: Sequence[int]) -> None:
        """Fold one interval's per-partition counts in."""
        total = sum(sample)
        if total <= 0:
            return  # an idle interval says nothing about who carries what
        self.samples += 1
        a = max(self.alpha, 1.0 / self.samples)
        self.total += a * (total - self.total)
        share, var = self.share, self.var
        for p, x in enumerate(sample):
            f = x / total
            if p >= len(share):
                share.append(f)
                var.append(max(x, 1) / (total * total))
                continue
            d = f - share[p]
            share[p] += a * d
            # the weighted variance update (West 1979): exact for the plain mean, the usual EWMA one after it
            var[p] = (1 - a) * (var[p] + a * d * d)

    def respread(self, before: Sequence[int], after: Sequence[int]) -> None:
        """A type routed over ``before`` is routed evenly over ``after`` from now on (a ``split="auto"`` resize):
        its share moves with it at once, rather than over the intervals smoothing would take to notice."""
        while len(self.share) <= max((*before, *after), default=-1):
            self.share.append(0.0)
            self.var.append(0.0)
        total = sum(self.share[p] for p in before)
        for p in before:
            self.share[p] = 0.0
        for p in after:
            self.share[p] = total / len(after)

    @property
    def mean(self) -> list[float]:
        """Each partition's mean items per interval."""
        return [f * self.total for f in self.share]

    def spread(self) -> list[float]:
        """The standard error of each partition's mean, in items per interval."""
        n = max(1, self.samples)
        factor = self.alpha / (2 - self.alpha) if self.alpha > 1.0 / n else 1.0 / n
        return [(v * factor) ** 0.5 * self.total for v in self.var]

    def rounded(self) -> list[int]:
        """The means as whole items per interval."""
        return [round(x) for x in self.mean]
