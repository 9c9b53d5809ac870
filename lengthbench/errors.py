"""Errors that the command line turns into a one-line message and exit code 2."""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input from the user: an unknown name, an impossible argument, a missing folder."""
