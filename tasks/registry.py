"""The registry of task families (``--task``), by name.

``tasks/`` imports nothing else of lengthbench, so the one registry class lives here; ``lengthbench.models``
uses it for mechanisms and encodings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(LookupError, ValueError):
    """An unknown registry name; the message names the valid choices. A ``ValueError`` too, so that the harness's
    handling of bad arguments reports it as one line."""


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *, aliases: tuple[str, ...] = (), replace: bool = False) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            if name in self._entries and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            for alias in aliases:
                self._aliases[alias] = name
            return entry

        return decorator

    def canonical(self, name: str) -> str:
        name = self._aliases.get(name, name)
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; choose from: {', '.join(self.names())}")
        return name

    def get(self, name: str) -> T:
        return self._entries[self.canonical(name)]

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return self._aliases.get(name, name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
