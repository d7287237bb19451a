"""Buffer strategies and partition selectors."""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable
from typing import Any

from .errors import ConfigError

Selector = Callable[[Any, int], int]


class BufferStrategy(enum.Enum):
    """What ``produce`` does when the item's partition is full."""

    BLOCKING = "blocking"  # wait for room (the default)
    IF_POSSIBLE = "if_possible"  # return False: the item is dropped and counted


def stable_type_hash(type_: type) -> int:
    """A hash of a type that is the same in every process (``hash(type)`` is address-based)."""
    return zlib.crc32(f"{type_.__module__}.{type_.__qualname__}".encode())


class _TypeHash:
    """All items of one Python type go to one partition.

    The queue recognises this selector and routes through a type -> partition table instead of calling it, so a
    type keeps its partition when adaptive partitions grow (no item of a type is ever split across partitions).
    Called directly it is ``stable_type_hash(type(item)) % partition_count``.
    """

    def __call__(self, item: Any, partition_count: int) -> int:
        return stable_type_hash(type(item)) % partition_count

    def __repr__(self) -> str:
        return "PartitionSelector.type_hash()"


class _KeyHash:
    """Items with equal ``key_fn(item)`` go to one partition."""

    def __init__(self, key_fn: Callable[[Any], Any]) -> None:
        if not callable(key_fn):
            raise ConfigError("key_hash needs a callable key function")
        self.key_fn = key_fn

    def __call__(self, item: Any, partition_count: int) -> int:
        return hash(self.key_fn(item)) % partition_count

    def __repr__(self) -> str:
        return f"PartitionSelector.key_hash({self.key_fn!r})"


_TYPE_HASH = _TypeHash()


class PartitionSelector:
    """Factories for the built-in selectors. Any callable ``(item, partition_count) -> int`` is a selector too."""

    @staticmethod
    def type_hash() -> Selector:
        return _TYPE_HASH

    @staticmethod
    def key_hash(key_fn: Callable[[Any], Any]) -> Selector:
        return _KeyHash(key_fn)


def is_type_hash(selector: object) -> bool:
    return isinstance(selector, _TypeHash)
