"""Throughput-weighted partition placement (LPT), shared by the queue and the Spark engine's skew planner."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

SKIP_RATIO = 1.15  # below this max/min task load nothing moves
_EXACT_RELABEL_TASKS = 7  # up to this many tasks, bins are matched to tasks by trying every permutation


def task_loads(throughput: Sequence[int], owner: Sequence[int], task_count: int) -> list[int]:
    loads = [0] * task_count
    for p, t in enumerate(owner):
        if 0 <= t < task_count:
            loads[t] += throughput[p]
    return loads


def _ratio(loads: Sequence[int]) -> float:
    lo = min(loads)
    return float("inf") if lo == 0 else max(loads) / lo


def lpt_bins(weights: Sequence[int], bins: int, prefer: Sequence[int] | None = None) -> list[int]:
    """Longest-processing-time placement: items by weight desc, each to the least-loaded bin.

    Ties between equally loaded bins go to ``prefer[i]`` (e.g. the current owner) when given, else the lowest bin.
    Returns the bin of every item. Deterministic. 4/3-approximation of the optimal makespan.
    """
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    loads = [0] * bins
    out = [0] * len(weights)
    for i in order:
        pref = prefer[i] if prefer is not None else -1
        # O(bins) argmin: task counts are small, and ties are decided explicitly (preferred bin, then lowest)
        b = min(range(bins), key=lambda k: (loads[k], k != pref, k))
        loads[b] += weights[i]
        out[i] = b
    return out


def _relabel(plan: list[int], throughput: Sequence[int], owner: Sequence[int], task_count: int) -> list[int]:
    """Rename the plan's bins so that as much load as possible stays where it is (fewest items in flight move).

    Bins are interchangeable (the same loads under any naming), so this picks the naming that keeps the most
    throughput on its current owner; lightly loaded partitions are then the ones that move.
    """
    keep = [[0] * task_count for _ in range(task_count)]  # keep[bin][task]: load of bin already on task
    for p, b in enumerate(plan):
        t = owner[p]
        if 0 <= t < task_count:
            keep[b][t] += throughput[p]
    if task_count <= _EXACT_RELABEL_TASKS:
        best: Sequence[int] = max(
            itertools.permutations(range(task_count)), key=lambda perm: sum(keep[b][perm[b]] for b in range(task_count))
        )
    else:
        chosen = [-1] * task_count
        used: set[int] = set()
        pairs = sorted(((keep[b][t], -b, -t) for b in range(task_count) for t in range(task_count)), reverse=True)
        for _, nb, nt in pairs:
            b, t = -nb, -nt
            if chosen[b] < 0 and t not in used:
                chosen[b] = t
                used.add(t)
        best = chosen
    return [best[b] for b in plan]


def sticky_moves(throughput: Sequence[int], owner: Sequence[int], task_count: int, target_max: float) -> list[int]:
    """Start from the current owners and move as little as possible until the heaviest task carries at most
    ``target_max``: each step takes the heaviest and the lightest task and moves the one partition (or, failing
    that, swaps the one pair) that narrows their gap the most. The best partition to move is the one closest to
    half the gap: warm, not hot (seed 004: "move the warm, not the hot"). Returns the new owners (a local optimum:
    it may stop above ``target_max``)."""
    plan = list(owner)
    loads = task_loads(throughput, plan, task_count)
    on: list[list[int]] = [[] for _ in range(task_count)]
    for p, t in enumerate(plan):
        if 0 <= t < task_count and throughput[p] > 0:
            on[t].append(p)
    for _ in range(4 * len(throughput) + 4):
        h = max(range(task_count), key=lambda t: (loads[t], -t))
        if loads[h] <= target_max:
            break
        lo = min(range(task_count), key=lambda t: (loads[t], t))
        gap = loads[h] - loads[lo]
        best, best_gain = None, 0
        for p in on[h]:  # a move of weight w (0 < w < gap) lowers the pair's max by min(w, gap - w)
            w = throughput[p]
            if 0 < w < gap and min(w, gap - w) > best_gain:
                best, best_gain = (p, -1), min(w, gap - w)
        if best is None:  # no single partition fits the gap: the best swap of a heavier for a lighter one
            for a in on[h]:
                for b in on[lo]:
                    d = throughput[a] - throughput[b]
                    if 0 < d < gap and min(d, gap - d) > best_gain:
                        best, best_gain = (a, b), min(d, gap - d)
        if best is None:
            break
        a, b = best
        plan[a] = lo
        on[h].remove(a)
        on[lo].append(a)
        loads[h] -= throughput[a]
        loads[lo] += throughput[a]
        if b >= 0:
            plan[b] = h
            on[lo].remove(b)
            on[h].append(b)
            loads[lo] -= throughput[b]
            loads[h] += throughput[b]
    return plan


class DrainBalancer:
    """Decides partition -> drain task ownership from measured throughput. Stateless and thread-safe.

    ``trigger``: nothing moves while max/min task load stays below it (hysteresis: noise on a steady load moves
    nothing). ``min_gain``: nor unless the heaviest task's load drops by at least this fraction (a load that no
    plan can even out, such as one hot partition, is not reshuffled by every interval's noise). ``tolerance``:
    how far above the best balance LPT finds from scratch a sticky plan may stay.
    Any object with an ``assign`` method of the same signature (:class:`Balancer`) can be plugged into
    ``BatchQueueConfig.balancer``.
    """

    def __init__(self, trigger: float = SKIP_RATIO, min_gain: float = 0.1, tolerance: float = 0.01) -> None:
        if trigger < 1.0 or not 0.0 <= min_gain < 1.0 or tolerance < 0.0:
            raise ValueError("trigger must be >= 1.0, min_gain in [0, 1), tolerance >= 0")
        self.trigger = trigger
        self.min_gain = min_gain
        self.tolerance = tolerance

    @classmethod
    def throughput_weighted(
        cls, trigger: float = SKIP_RATIO, min_gain: float = 0.1, tolerance: float = 0.01
    ) -> DrainBalancer:
        return cls(trigger, min_gain, tolerance)

    @staticmethod
    def place(weights: Sequence[int], bins: int) -> list[int]:
        """The LPT planner itself: the bin of each item, items by weight desc each onto the least-loaded bin
        (ties to the lowest bin). Deterministic; within 4/3 of the optimal makespan. Used wherever weighted work
        is placed (the Spark engine places skewed per-type work with it)."""
        return lpt_bins(weights, bins)

    def assign(self, throughput: Sequence[int], current_owner: Sequence[int], task_count: int) -> list[int] | None:
        """New owner per partition, or None to leave things as they are.

        None when there is no load, when the current max/min task load is below ``trigger``, or when no plan
        lowers the heaviest task's load by ``min_gain``. The plan is sticky (Kafka's cooperative-sticky assignor,
        seed 004): LPT from scratch says how low the heaviest task can go; then, from the current owners, the fewest
        and lightest moves that bring it within ``tolerance`` of that (:func:`sticky_moves`). Only if those cannot
        get there is the LPT plan itself used (relabelled so the heaviest partitions stay where they are).
        Partitions with zero throughput keep their owner.
        """
        if task_count <= 1 or len(throughput) != len(current_owner):
            return None
        if sum(throughput) <= 0:
            return None
        before = task_loads(throughput, current_owner, task_count)
        if _ratio(before) < self.trigger:
            return None
        hot = [p for p, w in enumerate(throughput) if w > 0]
        bins = lpt_bins([throughput[p] for p in hot], task_count, [current_owner[p] for p in hot])
        relabeled = _relabel(bins, [throughput[p] for p in hot], [current_owner[p] for p in hot], task_count)
        lpt = list(current_owner)
        for p, b in zip(hot, relabeled):
            lpt[p] = b
        best_max = max(task_loads(throughput, lpt, task_count))
        sticky = sticky_moves(throughput, current_owner, task_count, best_max * (1 + self.tolerance))
        sticky_max = max(task_loads(throughput, sticky, task_count))
        plan = sticky if sticky_max <= best_max * (1 + self.tolerance) else lpt
        if max(task_loads(throughput, plan, task_count)) > max(before) * (1 - self.min_gain):
            return None
        return plan

    def __repr__(self) -> str:
        return (f"DrainBalancer.throughput_weighted(trigger={self.trigger}, min_gain={self.min_gain}, "
                f"tolerance={self.tolerance})")  # fmt: skip


def moved_load_lower_bound(loads_before: Sequence[int], max_after: float) -> float:
    """The least load any plan must move to bring every task to at most ``max_after``: each task's excess."""
    return float(sum(max(0.0, load - max_after) for load in loads_before))
