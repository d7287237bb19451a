"""Throughput-weighted partition placement (LPT), shared by the queue and the Spark engine's skew planner."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

SKIP_RATIO = 1.01  # below this max/min task load nothing moves (a cheap first test; the noise test decides)
SIGNIFICANCE = 3.0  # a plan's gain must exceed this many standard errors of the loads it is measured on
_EXACT_RELABEL_TASKS = 7  # up to this many tasks, bins are matched to tasks by trying every permutation


def task_loads(throughput: Sequence[float], owner: Sequence[int], task_count: int) -> list[float]:
    loads = [0.0] * task_count
    for p, t in enumerate(owner):
        if 0 <= t < task_count:
            loads[t] += throughput[p]
    return loads


def _ratio(loads: Sequence[float]) -> float:
    lo = min(loads)
    return float("inf") if lo == 0 else max(loads) / lo


def lpt_bins(weights: Sequence[float], bins: int, prefer: Sequence[int] | None = None) -> list[int]:
    """Longest-processing-time placement: items by weight desc, each to the least-loaded bin.

    Ties between equally loaded bins go to ``prefer[i]`` (e.g. the current owner) when given, else the lowest bin.
    Returns the bin of every item. Deterministic. 4/3-approximation of the optimal makespan.
    """
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    loads = [0.0] * bins
    out = [0] * len(weights)
    for i in order:
        pref = prefer[i] if prefer is not None else -1
        # O(bins) argmin: task counts are small, and ties are decided explicitly (preferred bin, then lowest)
        b = min(range(bins), key=lambda k: (loads[k], k != pref, k))
        loads[b] += weights[i]
        out[i] = b
    return out


def _relabel(plan: list[int], throughput: Sequence[float], owner: Sequence[int], task_count: int) -> list[int]:
    """Rename the plan's bins so that as much load as possible stays where it is (fewest items in flight move).

    Bins are interchangeable (the same loads under any naming), so this picks the naming that keeps the most
    throughput on its current owner; lightly loaded partitions are then the ones that move.
    """
    keep = [[0.0] * task_count for _ in range(task_count)]  # keep[bin][task]: load of bin already on task
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


def sticky_moves(
    throughput: Sequence[float], owner: Sequence[int], task_count: int, target_max: float, target_min: float = 0.0
) -> list[int]:
    """Start from the current owners and move as little as possible until the heaviest task carries at most
    ``target_max`` and the lightest at least ``target_min``: each step takes the heaviest and the lightest task and
    moves the one partition (or, failing that, swaps the one pair) that narrows their gap the most. The best
    partition to move is the one closest to half the gap: warm, not hot (seed 004: "move the warm, not the hot").
    Returns the new owners (a local optimum: it may stop short of the targets)."""
    plan = list(owner)
    loads = task_loads(throughput, plan, task_count)
    on: list[list[int]] = [[] for _ in range(task_count)]
    for p, t in enumerate(plan):
        if 0 <= t < task_count and throughput[p] > 0:
            on[t].append(p)
    for _ in range(4 * len(throughput) + 4):
        h = max(range(task_count), key=lambda t: (loads[t], -t))
        lo = min(range(task_count), key=lambda t: (loads[t], t))
        if loads[h] <= target_max and loads[lo] >= target_min:
            break
        gap = loads[h] - loads[lo]
        best, best_gain = None, 0.0
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


def starves_a_task(throughput: Sequence[float], owner: Sequence[int], task_count: int) -> bool:
    """Whether a task carries no load while another holds two or more loaded partitions (a plan must never leave
    things so: one of those partitions would run on the idle task at no cost to anyone)."""
    loaded = [0] * task_count
    for p, t in enumerate(owner):
        if throughput[p] > 0 and 0 <= t < task_count:
            loaded[t] += 1
    return min(loaded) == 0 and max(loaded) >= 2


def load_noise(spread: Sequence[float], owner: Sequence[int], task: int) -> float:
    """The standard error of a task's measured load: the partitions' standard errors, added in quadrature."""
    return sum(spread[p] ** 2 for p, t in enumerate(owner) if t == task) ** 0.5


class DrainBalancer:
    """Decides partition -> drain task ownership from measured throughput. Stateless and thread-safe.

    A plan is made when it pays and the measurements say so, not by a gain floor that would hide a real imbalance:

    * ``trigger``: nothing moves while max/min task load stays below it (a cheap first test).
    * the gain (how much lower the heaviest task's load gets) must exceed :data:`SIGNIFICANCE` standard errors of
      the loads it compares, when the caller gives the partitions' standard errors (``spread``; the queue's
      periodic rebalance does, from each partition's interval-to-interval variation): a noisy steady load then
      moves nothing, while an imbalance of a few percent that the measurements resolve is evened out.
    * ``min_gain``: and at least this fraction of the heaviest task's load (default 0.5%: not worth a handoff
      below that).
    * a plan never leaves a task idle while another holds two or more loaded partitions, and such a placement is
      always fixed.

    ``tolerance``: how far above the best balance LPT finds from scratch a sticky plan may stay. Any object with an
    ``assign`` method of the same signature (:class:`Balancer`) can be plugged into ``BatchQueueConfig.balancer``.
    """

    def __init__(self, trigger: float = SKIP_RATIO, min_gain: float = 0.005, tolerance: float = 0.002) -> None:
        if trigger < 1.0 or not 0.0 <= min_gain < 1.0 or tolerance < 0.0:
            raise ValueError("trigger must be >= 1.0, min_gain in [0, 1), tolerance >= 0")
        self.trigger = trigger
        self.min_gain = min_gain
        self.tolerance = tolerance

    @classmethod
    def throughput_weighted(
        cls, trigger: float = SKIP_RATIO, min_gain: float = 0.005, tolerance: float = 0.002
    ) -> DrainBalancer:
        return cls(trigger, min_gain, tolerance)

    @staticmethod
    def place(weights: Sequence[int], bins: int) -> list[int]:
        """The LPT planner itself: the bin of each item, items by weight desc each onto the least-loaded bin
        (ties to the lowest bin). Deterministic; within 4/3 of the optimal makespan. Used wherever weighted work
        is placed (the Spark engine places skewed per-type work with it)."""
        return lpt_bins(weights, bins)

    def assign(
        self,
        throughput: Sequence[float],
        current_owner: Sequence[int],
        task_count: int,
        spread: Sequence[float] | None = None,
    ) -> list[int] | None:
        """New owner per partition, or None to leave things as they are.

        ``throughput``: each partition's load (items per interval); ``spread``: the standard error of each of those
        (None: take them as exact). None when there is no load, when the current max/min task load is below
        ``trigger``, or when no plan lowers the heaviest task's load by more than ``min_gain`` and (with
        ``spread``) by more than the noise, unless a task is idle while another holds two loaded partitions.
        The plan is sticky (Kafka's cooperative-sticky assignor, seed 004): LPT from scratch says how low the
        heaviest task can go and how high the lightest; then, from the current owners, the fewest and lightest
        moves that bring both within ``tolerance`` of that (:func:`sticky_moves`). Only if those cannot get there
        is the LPT plan itself used (relabelled so the heaviest partitions stay where they are). Partitions with
        zero throughput keep their owner.
        """
        if task_count <= 1 or len(throughput) != len(current_owner):
            return None
        if sum(throughput) <= 0:
            return None
        before = task_loads(throughput, current_owner, task_count)
        starved = starves_a_task(throughput, current_owner, task_count)
        if _ratio(before) < self.trigger and not starved:
            return None
        hot = [p for p, w in enumerate(throughput) if w > 0]
        bins = lpt_bins([throughput[p] for p in hot], task_count, [current_owner[p] for p in hot])
        relabeled = _relabel(bins, [throughput[p] for p in hot], [current_owner[p] for p in hot], task_count)
        lpt = list(current_owner)
        for p, b in zip(hot, relabeled):
            lpt[p] = b
        lpt_loads = task_loads(throughput, lpt, task_count)
        most, least = max(lpt_loads) * (1 + self.tolerance), min(lpt_loads) / (1 + self.tolerance)
        sticky = sticky_moves(throughput, current_owner, task_count, most, least)
        sticky_loads = task_loads(throughput, sticky, task_count)
        good = max(sticky_loads) <= most and min(sticky_loads) >= least
        plan = sticky if good and not starves_a_task(throughput, sticky, task_count) else lpt
        if plan == list(current_owner):
            return None
        if starved:
            return plan
        after = task_loads(throughput, plan, task_count)
        gain = max(before) - max(after)
        if gain <= max(before) * self.min_gain:
            return None
        if spread is not None:
            heaviest = max(range(task_count), key=lambda t: before[t])
            new_heaviest = max(range(task_count), key=lambda t: after[t])
            noise = math.hypot(load_noise(spread, current_owner, heaviest), load_noise(spread, plan, new_heaviest))
            if gain <= SIGNIFICANCE * noise:
                return None
        return plan

    def __repr__(self) -> str:
        return (f"DrainBalancer.throughput_weighted(trigger={self.trigger}, min_gain={self.min_gain}, "
                f"tolerance={self.tolerance})")  # fmt: skip


def moved_load_lower_bound(loads_before: Sequence[float], max_after: float) -> float:
    """The least load any plan must move to bring every task to at most ``max_after``: each task's excess."""
    return float(sum(max(0.0, load - max_after) for load in loads_before))
