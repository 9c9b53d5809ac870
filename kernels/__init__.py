"""Fused Triton attention kernels (``lengthbench.kernels``), one folder per op (``kernels/<op>/``: the op, its
forward and backward kernels, and a dense ``naive.py`` reference), with the helpers they share in ``utils/``.

A mechanism registers its op with its module and weights (``register_attention(name, weights=fn, kernel=op)`` in
``lengthbench.models.attention``): ``op`` is the op itself or its import path, ``"package.module:function"`` (so
that registering needs no Triton). The attention modules ask the registry for their op on CUDA
(``lengthbench.models.attention.get_kernel``, which calls :func:`get_op` here) and fall back to their dense reference
where there is none (no CUDA, no Triton, or no op for the mechanism). Every op has the signature::

    op(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, tuning=None, **mechanism_params) -> out

with ``q, k, v`` of shape ``[batch, heads, tokens, head_dim]`` (causal), ``slopes`` a ``[heads]`` tensor of
ALiBi slopes (score ``- slope_h * (r - j)``) or None, ``row_scale`` an optional ``[batch, heads, tokens]``
factor multiplying each query row's (biased) scores, ``sm_scale`` default ``1 / sqrt(head_dim)``, ``tuning`` the
op's launch settings (a dict of its keys; None: its defaults; an op without launch settings need not take it), and
``out`` of the shape of ``q``. The one exception is ``tda``, which takes both views::

    op(q1, k1, q2, k2, v, *, lam, slopes=None, row_scale=None, sm_scale=None, **mechanism_params) -> out

The built-in ops' extra parameters: entmax ``alpha`` (1.5 or 2), sieve ``alpha`` (1.5 only), sieve-window ``eps``,
softpick ``eps``, tra ``beta``/``kappa``/``power`` (unit q, k and ``sm_scale=1`` from the module), tda those of tra
plus ``lam``. All give gradients to q, k, v, ``row_scale`` and ``slopes`` (and tra's and tda's ``beta``, tda's
``lam``). The positional tensors are cast to the dtype of the last one (``v``): under bf16 autocast, normalised or
rotated queries and keys come out in fp32 while ``v`` is bf16.

This package imports neither ``lengthbench.models`` nor the harness.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable

# an op given as itself (a plugin's), by its path: where a compiled graph's node finds it again
_GIVEN: dict[str, Callable] = {}


def op_path(op: str | Callable) -> str:
    """The import path ``"package.module:function"`` of ``op`` (an op or its path)."""
    if isinstance(op, str):
        if ":" not in op:
            raise ValueError(f"a kernel's path is 'package.module:function', got {op!r}")
        return op
    path = f"{op.__module__}:{op.__qualname__}"
    _GIVEN[path] = op
    return path


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


def get_op(op: str | Callable, tuning: dict | None = None, in_graph: bool = False) -> Callable | None:
    """The fused op ``op`` (an op or its path) ready to call, or None where it cannot run here (no CUDA, no
    Triton). ``tuning``: the op's launch settings (the training step's, ``lengthbench/compile_policy.py``);
    ``in_graph``: as a node of a compiled graph rather than a graph break where autograd records the call
    (``utils/graph_node.py``)."""
    if not triton_available():
        return None
    if in_graph:
        from lengthbench.kernels.utils.graph_node import graph_node_op

        return graph_node_op(op_path(op), tuning)
    return load_op(op, tuning)


def load_op(op: str | Callable, tuning: dict | None = None) -> Callable:
    """The fused op ``op`` (an op or its path) wherever Triton imports (on a CPU, under ``TRITON_INTERPRET=1``),
    without the CUDA check of :func:`get_op`, with the launch settings ``tuning``, its positional tensors cast to
    the last one's dtype and hidden from torch.compile."""
    return _load_op(op_path(op), _tuning_key(tuning))


@functools.cache
def _load_op(path: str, key: str) -> Callable:
    import torch

    op = _GIVEN.get(path)
    if op is None:
        module_name, function_name = path.split(":")
        op = getattr(importlib.import_module(module_name), function_name)
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
