"""lengthbench: how far does an attention mechanism extrapolate? Train at 64 tokens, score to 1024x."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so that importing lengthbench.tasks or lengthbench.kernels does not import torch models.
    if name == "attention_weights":
        from lengthbench.models.attention import attention_weights

        return attention_weights
    if name in ("register_attention",):
        from lengthbench.models import attention

        return getattr(attention, name)
    if name == "register_task":
        from lengthbench.tasks import register_task

        return register_task
    if name == "register_pe":
        from lengthbench.models.positional import register_pe

        return register_pe
    raise AttributeError(f"module 'lengthbench' has no attribute {name!r}")


__all__ = ["__version__", "attention_weights", "register_attention", "register_pe", "register_task"]


def checkout_path(*parts: str) -> Path:
    """A path of the checkout (``results/benchmarks``, ``configs``): beside the package where it runs from a
    checkout (an editable install), else under the current folder (a package installed from a checkout and run
    from it, as on a GPU machine); the first where it exists, else the package's."""
    beside = Path(__file__).resolve().parent.parent.joinpath(*parts)
    here = Path.cwd().joinpath(*parts)
    return beside if beside.exists() or not here.exists() else here
