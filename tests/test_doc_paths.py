"""Every path that the docs and the package's docstrings name exists, and every command-line option they name is
an option of some command: a rename that leaves a stale name behind fails here.

Scanned: README.md, CONTRIBUTING.md, docs/*.md, results/README.md, results/benchmarks/README.md, configs/ (their
headers), and the docstrings and comments of lengthbench/, tasks/, models/ and kernels/. A path is a backticked name with a
slash or a file extension of ours (``results/runs/``, ``configs/NAME.toml`` with a placeholder in capitals is a
pattern, not a path); paths outside the repository (``../shared``, ``/tmp``), a run's own files under a store
(``<results>/``, ``RESULTS/``, ``DIR/``) and other projects' files (named with their repository) are not ours to
check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "results" / "README.md",
        ROOT / "results" / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [p for folder in ("lengthbench", "tasks", "models", "kernels") for p in sorted((ROOT / folder).rglob("*.py"))]
CONFIGS = sorted((ROOT / "configs").rglob("*.toml"))
TOP = ("lengthbench/", "tasks/", "models/", "kernels/", "tests/", "benchmarks/", "configs/", "docs/", "results/",
       "scripts/", "examples/", ".ci/")
BACKTICKED = re.compile(r"`([^`\s]+)`")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")


# Lines that name another project's files: the papers' authors' code (docs/conventions.md cites it by repository)
FOREIGN = re.compile(r"deep-spin|asentmax|zoology|shawntan|snap-research|Sparse code|TDA code|authors' (code|generator)")


def named_paths(text: str) -> set[str]:
    """The repository paths a text names: backticked names that start at one of our top folders, or a file at the
    top (README.md, pyproject.toml); not on a line that names another project's code."""
    found = set()
    ours = "\n".join(line for line in text.splitlines() if not FOREIGN.search(line))
    for token in BACKTICKED.findall(ours):
        token = token.rstrip(".,;:)").split("::")[0].split(":")[0] if token.startswith(TOP) else token
        if not token.startswith(TOP) and token not in ("README.md", "pyproject.toml", "CONTRIBUTING.md"):
            continue
        if any(mark in token for mark in ("*", "<", ">", "{", "}", "NAME", "RUN_ID", "TASK", "...")):
            continue  # a pattern
        found.add(token)
    return found


def cases():
    for path in DOCS + SOURCES + CONFIGS:
        if path.exists():
            for named in sorted(named_paths(path.read_text(encoding="utf-8"))):
                yield pytest.param(path, named, id=f"{path.relative_to(ROOT)}:{named}")


@pytest.mark.parametrize("source, named", list(cases()))
def test_a_named_path_exists(source, named):
    assert (ROOT / named).exists(), f"{source.relative_to(ROOT)} names {named}, which does not exist"


def known_options() -> set[str]:
    """Every option of every command (and of the benchmark scripts, which the docs name too)."""
    import click
    import typer

    from lengthbench.cli import app

    options: set[str] = set()

    def walk(command: click.Command) -> None:
        for param in command.params:
            options.update(o for o in param.opts + param.secondary_opts if o.startswith("--"))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        options.update(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", script.read_text(encoding="utf-8")))
        options.update(re.findall(r", \"(--[a-z0-9-]+)\"", script.read_text(encoding="utf-8")))
    return options


# Options of other programs that the docs name where they say how to call them
OTHER_PROGRAMS = {"--no-deps", "--index-url", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                  "--dependency", "--kill-on-invalid-dep", "--durations", "--no-index", "--upgrade", "--target",
                  "--help", "--head", "--port", "--address", "--logdir", "--porcelain", "--short",
                  "--untracked-files", "--dirty"}
# Options of our own processes that no user types: a sweep's worker (python -m lengthbench.sweep --worker)
INTERNAL = {"--worker"}


def test_every_named_option_is_an_option_of_ours():
    known = known_options() | OTHER_PROGRAMS | INTERNAL
    stale = {}
    for path in DOCS + SOURCES + CONFIGS:
        for option in set(OPTION.findall(path.read_text(encoding="utf-8"))):
            if option not in known:
                stale.setdefault(option, []).append(str(path.relative_to(ROOT)))
    assert not stale, f"options no command takes: {stale}"
