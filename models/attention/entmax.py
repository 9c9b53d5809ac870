"""alpha-entmax attention and its length-scaled variants: entmax, sparsemax, sentmax, asentmax (Long-Context Generalization with Sparse Attention).

``alpha-entmax(z)_j = [(alpha - 1) z_j - tau]_+ ^ (1 / (alpha - 1))`` with ``tau`` making the row sum to 1,
computed by the ``entmax`` package: exact sort-based ``entmax15`` (alpha 1.5) and ``sparsemax`` (alpha 2),
bisection for any other alpha > 1. Invisible keys get a finite filler score ``rowmax - 1/(alpha-1) - 1``:
any score at least ``1/(alpha-1)`` below the row maximum has weight exactly zero, and the package turns
``-inf`` into NaN.
"""

from __future__ import annotations

import torch
from entmax.activations import Entmax15Function, SparsemaxFunction
from entmax.root_finding import EntmaxBisectFunction
from torch import nn

from lengthbench.kernels.defaults import ENTMAX_ALPHA
from lengthbench.models.attention.base import (
    AttentionLayer,
    as_compute,
    causal_mask,
    row_counts,
)
from lengthbench.models.attention.registry import register_attention
from lengthbench.models.attention.scaled import (
    ASENTMAX_BETA_INIT,
    AdaptiveScaled,
    RowScaledAttention,
    adaptive_scale,
    scale_scores,
)


# The ``entmax`` package's autograd Functions define ``forward``/``backward`` as classmethods, which torch.compile
# cannot trace (a graph break at every call, and no CUDA graph for the training step). These Functions call the
# package's own forward and backward, taken out as plain functions, from static methods: the same numbers, and
# a compiled model traces them into one graph (tests/test_compiled_reference.py).
def _plain(function_class, name):
    method = function_class.__dict__[name]
    if not isinstance(method, classmethod):
        raise ImportError(f"entmax: {function_class.__name__}.{name} is no longer a classmethod; lengthbench "
                          "needs entmax 1.3 (pip install 'entmax>=1.3,<1.4')")
    return method.__func__


_ENTMAX15 = _plain(Entmax15Function, "forward"), _plain(Entmax15Function, "backward")
_SPARSEMAX = _plain(SparsemaxFunction, "forward"), _plain(SparsemaxFunction, "backward")
_BISECT = _plain(EntmaxBisectFunction, "forward"), _plain(EntmaxBisectFunction, "backward")


class _Entmax15(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        return _ENTMAX15[0](Entmax15Function, ctx, z, -1, None)

    @staticmethod
    def backward(ctx, grad):
        return _ENTMAX15[1](Entmax15Function, ctx, grad)[0]


class _Sparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        return _SPARSEMAX[0](SparsemaxFunction, ctx, z, -1, None)

    @staticmethod
    def backward(ctx, grad):
        return _SPARSEMAX[1](SparsemaxFunction, ctx, grad)[0]


class _EntmaxBisect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, alpha):
        return _BISECT[0](EntmaxBisectFunction, ctx, z, alpha, -1, 50, True)

    @staticmethod
    def backward(ctx, grad):
        grads = _BISECT[1](EntmaxBisectFunction, ctx, grad)
        return grads[0], None


def entmax_map(z: torch.Tensor, visible: torch.Tensor, alpha: float = 1.5) -> torch.Tensor:
    """alpha-entmax of each row of ``z`` over its ``visible`` (and finite) entries; zeros elsewhere; a row
    with nothing visible is all zero."""
    if alpha <= 1:
        raise ValueError(f"entmax needs alpha > 1, got {alpha} (alpha = 1 is softmax)")
    z = as_compute(z)
    visible = visible & torch.isfinite(z)
    has_any = visible.any(-1, keepdim=True)
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    row_max = torch.where(visible, z, torch.full((), float("-inf"), dtype=z.dtype, device=z.device))
    row_max = torch.where(has_any, row_max.amax(-1, keepdim=True), zero).detach()
    filled = torch.where(visible, z, row_max - (1.0 / (alpha - 1.0) + 1.0))
    if alpha == 1.5:
        p = _Entmax15.apply(filled)
    elif alpha == 2:
        p = _Sparsemax.apply(filled)
    else:
        p = _EntmaxBisect.apply(filled, alpha)
    return torch.where(visible & has_any, p, zero)


def entmax_weights(scores, mask, alpha=ENTMAX_ALPHA, query_positions=None):
    """``alpha-entmax(z)`` over ``j <= r`` (default alpha 1.5)."""
    return entmax_map(scores, mask, alpha)


def sparsemax_weights(scores, mask, query_positions=None):
    """sparsemax = 2-entmax over ``j <= r``."""
    return entmax_map(scores, mask, 2.0)


def asentmax_weights(scores, mask, beta=ASENTMAX_BETA_INIT, gamma=0.0, delta=1.0, alpha=ENTMAX_ALPHA,
                     query_positions=None):
    """``alpha-entmax((delta + beta_r * log(n_r + 1) ** gamma_r) * z)``; ``beta``, ``gamma`` floats or per
    row ``[..., Lq]`` (defaults: a zero-initialised projection, ``beta = log 2``, ``gamma = 0``). Uses
    ``log(r + 2)`` as the authors' code, not the paper's ``log n`` (see ``scaled.py``)."""
    z = as_compute(scores)
    return entmax_map(scale_scores(z, adaptive_scale(row_counts(mask, query_positions, z), beta, gamma, delta)),
                      mask, alpha)


def sentmax_weights(scores, mask, beta=ASENTMAX_BETA_INIT, gamma=0.0, delta=1.0, alpha=ENTMAX_ALPHA,
                    query_positions=None):
    """``alpha-entmax((delta + beta * log(n_r + 1) ** gamma) * z)`` with ``beta``, ``gamma`` floats or
    per-head ``[H]`` tensors."""
    def rows(value):
        return value[:, None] if torch.is_tensor(value) and value.dim() == 1 else value

    return asentmax_weights(scores, mask, rows(beta), rows(gamma), delta, alpha, query_positions)


# The fused entmax and sieve kernels implement alpha = 1.5 only; other alphas use the reference path.
KERNEL_ALPHA = 1.5


class _EntmaxKernel:
    base_kernel = "entmax"

    def kernel_params(self):
        return {"alpha": self.alpha}

    def kernel_supported(self):
        return self.alpha == KERNEL_ALPHA


@register_attention("entmax", weights=entmax_weights, kernel="lengthbench.kernels.entmax:entmax_attention")
class EntmaxAttention(AttentionLayer):
    """alpha-entmax attention (default alpha 1.5): sparse, sums to one."""

    def __init__(self, d_model, n_heads, pe, alpha: float = ENTMAX_ALPHA, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.alpha = float(alpha)

    def weights(self, scores, query_positions, x_rows):
        return entmax_weights(scores, causal_mask(query_positions, scores.shape[-1]), self.alpha)

    def kernel_supported(self) -> bool:
        return self.alpha == KERNEL_ALPHA

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda and self.kernel_supported() else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes(), alpha=self.alpha)
        return self.reference_attend(q, k, v, x)


@register_attention("sparsemax", weights=sparsemax_weights,
                    kernel="lengthbench.kernels.entmax:sparsemax_attention")
class SparsemaxAttention(AttentionLayer):
    """sparsemax attention (alpha-entmax with alpha = 2)."""

    def weights(self, scores, query_positions, x_rows):
        return sparsemax_weights(scores, causal_mask(query_positions, scores.shape[-1]))

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes())
        return self.reference_attend(q, k, v, x)


@register_attention("sentmax", weights=sentmax_weights)
class SEntmaxAttention(_EntmaxKernel, RowScaledAttention):
    """Scalable entmax (Long-Context Generalization with Sparse Attention): entmax((delta + beta * log(n_r + 1)^gamma) * z), beta and gamma
    learned per head directly (start: beta = log 2, gamma = 0, as ASEntmax's zero projections)."""

    def __init__(self, d_model, n_heads, pe, alpha: float = ENTMAX_ALPHA, delta: float = 1.0, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.alpha = float(alpha)
        self.delta = float(delta)
        self.beta = nn.Parameter(torch.full((n_heads,), ASENTMAX_BETA_INIT))
        self.gamma = nn.Parameter(torch.zeros(n_heads))

    def row_scale(self, query_positions, x_rows):
        counts = (query_positions + 1).to(torch.float32)[:, None]
        return adaptive_scale(counts, self.beta.float()[:, None], self.gamma.float()[:, None], self.delta)[None]

    def weight_function(self, scores, mask, query_positions, x_rows):
        return sentmax_weights(scores, mask, self.beta, self.gamma, self.delta, self.alpha, query_positions)

    def base_weights(self, z, mask):
        return entmax_weights(z, mask, self.alpha)


@register_attention("asentmax", weights=asentmax_weights)
class ASEntmaxAttention(_EntmaxKernel, AdaptiveScaled):
    """Adaptive-scalable entmax (Long-Context Generalization with Sparse Attention): entmax((delta + beta_r * log(n_r + 1)^gamma_r) * z) with
    beta_r, gamma_r projected from each query token; log(r + 2) as the authors' code."""

    def __init__(self, d_model, n_heads, pe, alpha: float = ENTMAX_ALPHA, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.alpha = float(alpha)

    def weight_function(self, scores, mask, query_positions, x_rows):
        beta, gamma = self.adaptive_params(x_rows)
        return asentmax_weights(scores, mask, beta, gamma, self.delta, self.alpha, query_positions)

    def base_weights(self, z, mask):
        return entmax_weights(z, mask, self.alpha)
