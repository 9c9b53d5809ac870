"""``lengthbench attn list | params`` and ``lengthbench pe list | params``."""

from __future__ import annotations

import re

import typer
from rich.console import Console
from rich.table import Table

out = Console()

# reStructuredText markup in docstrings: ``literal``, :role:`target`, `interpreted`
_RST = re.compile(r"(?::[\w:]+:)?``?([^`]+)``?")


def plain_summary(doc: str | None) -> str:
    """A docstring's first paragraph as one line of plain text, reStructuredText markup removed:
    ``"Gated softmax (Qiu et al. 2025): ``sigmoid(x W_g)``.\n\n    More."`` -> ``"Gated softmax (Qiu et al.
    2025): sigmoid(x W_g)."``"""
    paragraph = re.split(r"\n\s*\n", (doc or "").strip(), maxsplit=1)[0]
    return _RST.sub(r"\1", " ".join(line.strip() for line in paragraph.splitlines()))


# What each constructor keyword means; "NAME.key" where a key means something else for that mechanism.
PARAM_NOTES = {
    "alpha": "alpha of alpha-entmax (1.5: the fused kernels' value; other values run on the dense references)",
    "sieve.alpha": "alpha of the entmax support that filters the keys (1.5: the paper's and the fused kernel's value)",
    "eps": "the epsilon of softpick's denominator",
    "sieve-window.eps": "the window: keys within eps of the row's maximum score survive (2: the narrowest window "
                        "holding every 1.5-entmax support; 8 learned MQRAR)",
    "s_init": "initial per-head s of s * log(n) (SSMax: 1.0, the sparse-attention authors' code; Nakanishi's 0.43)",
    "log_offset": "SSMax's length term log(n + log_offset): 1 (log(r + 2), the sparse-attention authors' code) or 0",
    "delta": "the constant delta of the length factor delta + beta * log(n + 1)^gamma",
    "gamma_scale": "gamma's range: gamma = gamma_scale * tanh(x . w_gamma) (default 2, the sparse-attention authors' code)",
    "scaled_heads": "all: the length factor scales every head's scores, an ALiBi bias included; nope: only the "
                    "heads without an ALiBi slope, as the sparse-attention authors' code does under NAPE",
    "beta": "start of the learnable threshold scale beta in tau = beta * sqrt(2 log((n + c) / kappa) / d)",
    "kappa": "kappa in the threshold tau = beta * sqrt(2 log((n + c) / kappa) / d)",
    "tau_index": "c in tau's log((n + c) / kappa): alg1 (c 0: Algorithm 1 and the authors' kernel) or eq1 (c 1: Eq. 1)",
    "power": "the power p of (s - tau)_+ ^ p",
    "remainder": "where what is left of the stick goes: diagonal (the query's own value, Tan et al.) or drop "
                 "(nowhere: Sieve Attention's Eq. 7; stickbreaking's runs its dense reference, no fused kernel)",
    "lambda_init": "start of TDA's lambda, in (0, 1)",
    "base": "RoPE's base frequency",
    "factor": "Llama-3 scaling factor (the papers: 16)",
    "low_freq_factor": "Llama-3 scaling: wavelengths above original_context / low_freq_factor are divided by factor",
    "high_freq_factor": "Llama-3 scaling: wavelengths below original_context / high_freq_factor are kept",
    "original_context": "Llama-3 scaling: the context length the scaling starts from",
}
_STRUCTURAL = {"self", "d_model", "n_heads", "pe", "head_dim"}


def constructor_params(cls, base: type) -> dict:
    """``{key: default}`` of the keyword parameters that ``cls`` and its bases down to ``base`` take (what
    ``--attn-param`` / ``--pe-param`` accept), the nearest class's default first."""
    from lengthbench.validation import constructor_params as params

    return params(cls, base, frozenset(_STRUCTURAL))


def _params_table(title: str, name: str, params: dict) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("parameter", "default", "what it does"):
        table.add_column(column, no_wrap=column != "what it does")
    for key, default in params.items():
        table.add_row(key, repr(default), PARAM_NOTES.get(f"{name}.{key}", PARAM_NOTES.get(key, "")))
    if not params:
        table.add_row("(none)", "", "")
    return table


def register(app: typer.Typer) -> None:
    attn_app = typer.Typer(help="Attention mechanisms (--attn).", no_args_is_help=True)
    pe_app = typer.Typer(help="Positional encodings (--pe).", no_args_is_help=True)

    @attn_app.command("list")
    def attn_list() -> None:
        """List the registered attention mechanisms."""
        from lengthbench.models.attention import ATTENTION, get_kernel

        table = Table("attn", "fused kernel here", "description", expand=True)
        for name in ATTENTION.names():
            table.add_row(name, "yes" if get_kernel(name) else "no", plain_summary(ATTENTION.get(name).__doc__))
        out.print(table)

    @attn_app.command("params")
    def attn_params(name: str = typer.Argument(..., help="Mechanism (see `lengthbench attn list`).")) -> None:
        """List a mechanism's parameters (for --attn-param key=value, or name(key=value) in a sweep's cells)."""
        from lengthbench.errors import UsageError
        from lengthbench.models.attention import ATTENTION
        from lengthbench.models.attention.base import AttentionLayer

        if name not in ATTENTION.names():
            raise UsageError(f"unknown attention {name!r}; choose from: {', '.join(ATTENTION.names())}")
        out.print(_params_table(f"{name}: --attn-param key=value", name,
                                constructor_params(ATTENTION.get(name), AttentionLayer)))

    @pe_app.command("params")
    def pe_params(name: str = typer.Argument(..., help="Encoding (see `lengthbench pe list`).")) -> None:
        """List an encoding's parameters (for --pe-param key=value)."""
        from lengthbench.errors import UsageError
        from lengthbench.models.positional import POSITIONAL_ENCODINGS, PositionalEncoding

        if name not in POSITIONAL_ENCODINGS.names():
            raise UsageError(f"unknown positional encoding {name!r}; choose from: "
                             f"{', '.join(POSITIONAL_ENCODINGS.names())}")
        out.print(_params_table(f"{name}: --pe-param key=value", name,
                                constructor_params(POSITIONAL_ENCODINGS.get(name), PositionalEncoding)))

    @pe_app.command("list")
    def pe_list() -> None:
        """List the registered positional encodings."""
        from lengthbench.models.positional import POSITIONAL_ENCODINGS

        table = Table("pe", "description", expand=True)
        for name in POSITIONAL_ENCODINGS.names():
            table.add_row(name, plain_summary(POSITIONAL_ENCODINGS.get(name).__doc__))
        out.print(table)

    app.add_typer(attn_app, name="attn", rich_help_panel="Look up")
    app.add_typer(pe_app, name="pe", rich_help_panel="Look up")
