"""How many instances a ``split="auto"`` type should run as (seed 004: split an overcapacity partition, join
undercapacity ones), decided from measured load. Pure functions; the controller applies the decision.

What one drain task takes: the mean load of the queue's drain tasks (all items per interval over the task count).
A type carrying more than that cannot be evened out by placing partitions, whatever the balancer does: one task
would carry all of it. ``r = type load / mean task load`` says how many tasks' worth the type is; it should run as
about ``ceil(r)`` instances, each on a task of its own, at most one per task. Hysteresis keeps a type near a
boundary from flapping: it grows only once ``r`` exceeds its instance count by :data:`MARGIN` (10%), shrinks only
once ``r`` falls :data:`MARGIN` below one instance fewer, and either only after the same answer
:data:`CONFIRM` intervals in a row.
"""

from __future__ import annotations

import math

MARGIN = 0.1
CONFIRM = 2


def wanted_instances(type_load: float, total_load: float, tasks: int, current: int) -> int:
    """The instance count for a type now run as ``current`` instances (before :data:`CONFIRM`)."""
    if tasks <= 1 or total_load <= 0 or type_load <= 0:
        return 1 if current > 1 and type_load <= 0 else current
    r = type_load / (total_load / tasks)
    grow = min(tasks, math.ceil(r / (1 + MARGIN)))
    if grow > current:
        return grow
    shrink = max(1, math.ceil(r / (1 - MARGIN)))
    if shrink < current:
        return shrink
    return current
