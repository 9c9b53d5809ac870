"""Fused Triton attention kernels (``lengthbench.kernels``), one folder per op (``kernels/<op>/``: the op, its
forward and backward kernels, and a dense ``naive.py`` reference), with the helpers they share in ``utils/``.

The attention modules in ``lengthbench.models.attention`` ask :func:`get_kernel` for their op on CUDA
and fall back to their dense reference when it returns None (no CUDA, no Triton, or no kernel for the
mechanism). Every op has the signature::

    op(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, tuning=None, **mechanism_params) -> out

with ``q, k, v`` of shape ``[batch, heads, tokens, head_dim]`` (causal), ``slopes`` a ``[heads]`` tensor of
ALiBi slopes (score ``- slope_h * (r - j)``) or None, ``row_scale`` an optional ``[batch, heads, tokens]``
factor multiplying each query row's (biased) scores, ``sm_scale`` default ``1 / sqrt(head_dim)``, ``tuning`` the
op's launch settings (a dict of its keys; None: its defaults), and ``out`` of the shape of ``q``. The one
exception is ``tda``, which takes both views::

    op(q1, k1, q2, k2, v, *, lam, slopes=None, row_scale=None, sm_scale=None, **mechanism_params) -> out

The positional tensors are cast to the dtype of the last one (``v``): under bf16 autocast, normalised or
rotated queries and keys come out in fp32 while ``v`` is bf16.

This package imports neither ``lengthbench.models`` nor the harness.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable

# mechanism name -> "module:function" inside this package. Extra parameters: entmax ``alpha`` (1.5 or 2),
# sieve ``alpha`` (1.5 only), sieve-window ``eps``, softpick ``eps``, tra ``beta``/``kappa``/``power`` (unit q, k and
# ``sm_scale=1`` from the module), tda those of tra plus ``lam``. All ops give gradients to q, k, v, ``row_scale`` and
# ``slopes`` (and tra's and tda's ``beta``, tda's ``lam``).
_KERNELS: dict[str, str] = {
    "stickbreaking": "stickbreaking:stickbreaking_attention",
    "sieve": "sieve:sieve_attention",
    "sieve-window": "sieve:sieve_window_attention",
    "entmax": "entmax:entmax_attention",
    "sparsemax": "entmax:sparsemax_attention",
    "adatemp": "adatemp:adatemp_attention",
    "softpick": "softpick:softpick_attention",
    "rectified": "rectified:rectified_attention",
    "rela": "rela:rela_attention",
    "tra": "tra:tra_attention",
    "tda": "tda:tda_attention",
}


def triton_available() -> bool:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def qkv_heads_op() -> Callable | None:
    """``qkv_heads.qkv_heads`` (the query, key and value heads of the fused projections in one custom op each
    way) where Triton runs, else None."""
    if not triton_available():
        return None
    from lengthbench.kernels.qkv_heads import qkv_heads

    return qkv_heads


def has_kernel(mechanism: str) -> bool:
    """Whether :func:`get_kernel` gives ``mechanism`` an op here, decided without loading it: a forward that
    torch.compile traces may ask (``importlib`` in :func:`load_op` would break its graph; in ASEntmax's training step
    the compile failed on it)."""
    return mechanism in _KERNELS and triton_available()


def _tuning_key(tuning: dict | None) -> str:
    """``tuning`` as the text that :func:`load_op` keys its ops by."""
    return json.dumps(tuning or {}, sort_keys=True)


def _tuning_of(key: str) -> dict | None:
    """The tuning of :func:`_tuning_key`'s text, its lists the tuples of tile settings they were (a compiled
    graph's node carries the settings as JSON)."""

    def tuples(value):
        if isinstance(value, list):
            return tuple(tuples(v) for v in value)
        if isinstance(value, dict):
            return {k: tuples(v) for k, v in value.items()}
        return value

    tuning = tuples(json.loads(key))
    return tuning or None


def get_kernel(mechanism: str, tuning: dict | None = None, in_graph: bool = False) -> Callable | None:
    """The fused op of ``mechanism``, or None where it cannot run here (no CUDA, no Triton, or no kernel for
    the mechanism). ``tuning``: the op's launch settings (the training step's, ``lengthbench/compile_policy.py``);
    ``in_graph``: as a node of a compiled graph rather than a graph break where autograd records the call
    (``utils/graph_node.py``)."""
    if not has_kernel(mechanism):
        return None
    if in_graph:
        from lengthbench.kernels.utils.graph_node import graph_node_op

        return graph_node_op(mechanism, tuning)
    return load_op(mechanism, tuning)


def load_op(mechanism: str, tuning: dict | None = None) -> Callable:
    """The fused op of ``mechanism`` wherever Triton imports (on a CPU, under ``TRITON_INTERPRET=1``), without
    the CUDA check of :func:`get_kernel`, with the launch settings ``tuning``; a ``KeyError`` for a mechanism
    without one."""
    return _load_op(mechanism, _tuning_key(tuning))


@functools.cache
def _load_op(mechanism: str, key: str) -> Callable:
    import torch

    module_name, function_name = _KERNELS[mechanism].split(":")
    module = importlib.import_module(f"lengthbench.kernels.{module_name}")
    op = getattr(module, function_name)
    tuning = _tuning_of(key)
    if tuning is not None:
        op = functools.partial(op, tuning=tuning)
    # torch.compile must not trace into the Triton launches (Inductor re-types their constants);
    # a graph break keeps the op an opaque autograd function inside compiled models.
    return torch.compiler.disable(_same_dtype(op))


def _same_dtype(op: Callable) -> Callable:
    """``op`` with its positional tensors cast to the dtype of the last one."""

    @functools.wraps(op)
    def call(*tensors, **kwargs):
        dtype = tensors[-1].dtype
        return op(*(t if t.dtype == dtype else t.to(dtype) for t in tensors), **kwargs)

    return call


def kernel_names() -> list[str]:
    return sorted(_KERNELS)
