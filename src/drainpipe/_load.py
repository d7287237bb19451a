"""Per-partition load as the periodic rebalance plans on it: each partition's mean share of the items produced per
interval, over the intervals since its load last changed, and how sure that mean is (its standard error), so the
balancer can tell a real imbalance from interval noise.

Only the control thread uses a :class:`LoadEstimate`.
"""

from __future__ import annotations

from collections.abc import Sequence

SMOOTHING = 0.25  # weight of the newest interval in the fast mean that detects a change of load
WARMUP_SAMPLES = 3  # intervals measured before the first periodic plan
WINDOW = 64  # at most this many intervals in a partition's mean: older ones fade even on a steady load
SHIFT_SIGMAS = 4.0  # the fast mean this many standard errors off the window's mean: the load changed


class LoadEstimate:
    """Each partition's load: the plain mean of its share of the items over the intervals since its load last
    changed (at most :data:`WINDOW`), and how sure that mean is.

    A steady load is measured ever more exactly (the standard error falls as one over the root of the intervals
    seen), so a small imbalance the first plan left, invisible in a few noisy intervals, is resolved and evened out
    a little later; a load that changes is followed within an interval or two: beside the window's mean runs an
    exponentially weighted one with ``alpha`` for the newest interval, and once the two differ by more than
    :data:`SHIFT_SIGMAS` standard errors of their difference the window restarts from the fast mean (worth as many
    intervals as its own variance is: ``(2 - a) / a``).

    Shares, not counts: when producers block on full partitions, or an interval runs long, every partition's count
    rises and falls together, and that common swing says nothing about which task carries more. The variance of a
    share from interval to interval is tracked around the fast mean; the standard error of the window's mean is
    that variance over the window's length, scaled back to items by the mean total. A partition new since the last
    sample starts at its sample, its variance taken as Poisson-like (its own count) until measured."""

    def __init__(self, alpha: float = SMOOTHING) -> None:
        self.alpha = alpha
        self.samples = 0
        self.total = 0.0  # mean items per interval, all partitions (fast: it only scales shares to items)
        self.share: list[float] = []  # the window's mean share, what plans are made on
        self.fast: list[float] = []  # the exponentially weighted mean share
        self.var: list[float] = []  # of one interval's share, around the fast mean
        self.window: list[int] = []  # intervals in the window's mean

    def add(self, sample: Sequence[int]) -> None:
        """Fold one interval's per-partition counts in. Partitions beyond the sample were dropped (a shrink): they
        are forgotten, and one that comes back later starts at its sample like a new one."""
        if len(sample) < len(self.share):
            for series in (self.share, self.fast, self.var, self.window):
                del series[len(sample) :]
        total = sum(sample)
        if total <= 0:
            return  # an idle interval says nothing about who carries what
        self.samples += 1
        a = max(self.alpha, 1.0 / self.samples)
        self.total += a * (total - self.total)
        share, fast, var, window = self.share, self.fast, self.var, self.window
        restart = (2 - self.alpha) / self.alpha
        for p, x in enumerate(sample):
            f = x / total
            if p >= len(share):
                share.append(f)
                fast.append(f)
                var.append(max(x, 1) / (total * total))
                window.append(1)
                continue
            d = f - fast[p]
            fast[p] += a * d
            n = min(window[p] + 1, WINDOW)
            share[p] += (f - share[p]) / n
            off = fast[p] - share[p]
            # judged against the variance before this interval: a jump would otherwise widen its own yardstick
            if off * off > SHIFT_SIGMAS**2 * var[p] * (a / (2 - a) + 1.0 / n):
                share[p] = fast[p]  # the load changed
                n = int(min(n, restart))
            window[p] = n
            # the weighted variance update (West 1979): exact for the plain mean, the usual EWMA one after it
            var[p] = (1 - a) * (var[p] + a * d * d)

    def respread(self, before: Sequence[int], after: Sequence[int]) -> None:
        """A type routed over ``before`` is routed evenly over ``after`` from now on (a ``split="auto"`` resize):
        its share moves with it at once, rather than over the intervals smoothing would take to notice."""
        while len(self.share) <= max((*before, *after), default=-1):
            self.share.append(0.0)
            self.fast.append(0.0)
            self.var.append(0.0)
            self.window.append(1)
        total = sum(self.share[p] for p in before)
        for p in before:
            self.share[p] = self.fast[p] = 0.0
        for p in after:
            self.share[p] = self.fast[p] = total / len(after)

    @property
    def mean(self) -> list[float]:
        """Each partition's mean items per interval."""
        return [f * self.total for f in self.share]

    def spread(self) -> list[float]:
        """The standard error of each partition's mean, in items per interval."""
        return [(v / n) ** 0.5 * self.total for v, n in zip(self.var, self.window)]

    def rounded(self) -> list[int]:
        """The means as whole items per interval."""
        return [round(x) for x in self.mean]
