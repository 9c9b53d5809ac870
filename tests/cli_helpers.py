"""Run the ``lengthbench`` entry point in-process, as a shell would, and return its exit code."""

from __future__ import annotations

import sys


def cli(monkeypatch, *args) -> int:
    from lengthbench.cli import main

    monkeypatch.setattr(sys, "argv", ["lengthbench", *map(str, args)])
    try:
        main()
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0
