"""Errors that the command line turns into a one-line message: exit code 2 for bad input (``UsageError``),
1 for a run that failed on its own (``TrainingDiverged``)."""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input from the user: an unknown name, an impossible argument, a missing folder."""


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite: the run stops before it writes a checkpoint of the broken
    weights (the last checkpoint on disk is from before the divergence) and writes no results."""


def interrupted(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised while handling, a KeyboardInterrupt (Ctrl-C, ``timeout -s INT``).
    Inside a torch.compile'd step the interrupt can surface as another error: a ``SystemError`` ("...
    returned a result with an exception set") whose context is the KeyboardInterrupt."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
