"""``lengthbench attn list`` and ``lengthbench pe list``."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

out = Console()


def _first_line(obj) -> str:
    doc = (obj.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def register(app: typer.Typer) -> None:
    attn_app = typer.Typer(help="Attention mechanisms (--attn).", no_args_is_help=True)
    pe_app = typer.Typer(help="Positional encodings (--pe).", no_args_is_help=True)

    @attn_app.command("list")
    def attn_list() -> None:
        """List the registered attention mechanisms."""
        from lengthbench.kernels import get_kernel
        from lengthbench.models.attention import ATTENTION

        table = Table("attn", "fused kernel here", "description")
        for name in ATTENTION.names():
            table.add_row(name, "yes" if get_kernel(name) else "no", _first_line(ATTENTION.get(name)))
        out.print(table)

    @pe_app.command("list")
    def pe_list() -> None:
        """List the registered positional encodings."""
        from lengthbench.models.positional import POSITIONAL_ENCODINGS

        table = Table("pe", "description")
        for name in POSITIONAL_ENCODINGS.names():
            table.add_row(name, _first_line(POSITIONAL_ENCODINGS.get(name)))
        out.print(table)

    app.add_typer(attn_app, name="attn")
    app.add_typer(pe_app, name="pe")
