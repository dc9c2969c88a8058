"""A small LRU keyed by the exact value of plain JSON data, for work an agent repeats every turn.

Agents resend the same tool list on every turn; serialising or validating it again costs more than the rest
of a short turn. The key is the value's marshal bytes: C-fast, and type-exact where `==` is not (True, 1
and 1.0 are equal in Python but render differently in JSON). Values marshal cannot key are built each time.
"""

from __future__ import annotations

import marshal
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ValueCache(Generic[T]):
    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, T] = OrderedDict()

    def get(self, value: Any, build: Callable[[Any], T]) -> T:
        try:
            key = marshal.dumps(value)
        except ValueError:  # not plain data
            return build(value)
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        result = self._entries[key] = build(value)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return result
