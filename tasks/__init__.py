"""Task generators (``lengthbench.tasks``): one module per family, registered by name."""

from __future__ import annotations

from lengthbench.tasks.base import IGNORE_INDEX, SPLITS, Batch, ModelDefaults, Task
from lengthbench.tasks.registry import Registry, UnknownNameError

TASKS: Registry[type[Task]] = Registry("task")


def register_task(name: str, **kwargs):
    """Class decorator: ``@register_task("mytask")`` makes a :class:`Task` subclass runnable by name. A subclass
    that leaves one of :class:`Task`'s abstract methods out fails here, where it is defined (``TypeError``)."""

    def decorator(cls: type[Task]) -> type[Task]:
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise TypeError(f"task {name!r}: {cls.__name__} does not define {', '.join(missing)} "
                            "(abstract methods of Task)")
        cls.name = name
        return TASKS.register(name, **kwargs)(cls)

    return decorator


def get_task(name: str, **params) -> Task:
    return TASKS.get(name)(**params)


def task_names() -> list[str]:
    return TASKS.names()


def eval_multipliers(max_multiplier: int) -> list[int]:
    """The multipliers every evaluation uses: 1, 2, 4, ..., ``max_multiplier`` (a power of two)."""
    if max_multiplier < 1 or max_multiplier & (max_multiplier - 1):
        raise ValueError(f"--max-multiplier must be a power of two >= 1, got {max_multiplier}")
    return [1 << k for k in range(max_multiplier.bit_length())]


def as_multiplier(value: float) -> int | float:
    """A multiplier as the store and the tables use it: an int where integral (2, not 2.0), else a float."""
    value = float(value)
    return int(value) if value.is_integer() else value


def multiplier_label(value: float) -> str:
    """``"2"``, ``"1.5"``: a multiplier as column headers and log lines write it (before an ``x`` or ``×``)."""
    return str(as_multiplier(value))


def eval_lengths(train_length: int, max_multiplier: int,
                 extra: tuple[float, ...] = ()) -> list[tuple[int | float, int]]:
    """``(multiplier, nominal length)`` pairs, the one place evaluation lengths come from: the powers of two
    up to ``max_multiplier``, plus a task's ``extra`` points within that range (Reverse's 1.5x, a column of
    Long-Context Generalization with Sparse Attention), at ``round(train_length * m)``. Integral multipliers are ints, the others floats."""
    points: dict[int | float, int] = {m: train_length * m for m in eval_multipliers(max_multiplier)}
    for m in extra:
        if 1 < m <= max_multiplier and m not in points:
            points[as_multiplier(m)] = round(train_length * m)
    return sorted(points.items())


# Importing the modules registers their tasks.
from lengthbench.tasks import copy as _copy  # noqa: E402,F401
from lengthbench.tasks import flipflop as _flipflop  # noqa: E402,F401
from lengthbench.tasks import localcount as _localcount  # noqa: E402,F401
from lengthbench.tasks import maxretrieval as _maxretrieval  # noqa: E402,F401
from lengthbench.tasks import mqmtar as _mqmtar  # noqa: E402,F401
from lengthbench.tasks import mqrar as _mqrar  # noqa: E402,F401
from lengthbench.tasks import nback as _nback  # noqa: E402,F401
from lengthbench.tasks import passkey as _passkey  # noqa: E402,F401

__all__ = [
    "IGNORE_INDEX",
    "SPLITS",
    "TASKS",
    "Batch",
    "ModelDefaults",
    "Task",
    "UnknownNameError",
    "as_multiplier",
    "eval_lengths",
    "multiplier_label",
    "eval_multipliers",
    "get_task",
    "register_task",
    "task_names",
]
