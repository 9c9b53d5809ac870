"""Softpick and its relatives from the paper "Softpick": softpick, scalable-softpick, rectified (ReLU-masked) softmax.

``softpick(z)_j = ReLU(e^z_j - 1) / (sum_{k <= r} |e^z_k - 1| + eps)``, rows sum to at most one. It is
computed shifted by ``m = max(0, rowmax)``: ``ReLU(e^(z-m) - e^-m) / (sum |e^(z-m) - e^-m| + eps e^-m)``,
which equals the formula above exactly and overflows for no input. (The paper's "numerically safe" eq. 2
adds an unscaled ``eps`` after shifting by the row max, which differs from its eq. 1 by ``eps (1 - e^-m)``;
we follow the definition of ATTENTION.md. A kernel reproduces it by adding ``eps * exp(-m)`` at the end.)
"""

from __future__ import annotations

import torch

from lengthbench.kernels.defaults import SOFTPICK_EPS
from lengthbench.models.attention.base import (
    AttentionLayer,
    as_compute,
    causal_mask,
    row_counts,
    safe_softmax,
    zeros_where_not,
)
from lengthbench.models.attention.registry import register_attention
from lengthbench.models.attention.scaled import SSMAX_S_INIT, LogLengthScaled, log_length_scale, scale_scores


def softpick_map(z: torch.Tensor, visible: torch.Tensor, eps: float = SOFTPICK_EPS) -> torch.Tensor:
    z = as_compute(z).masked_fill(~visible, float("-inf"))
    shift = z.amax(-1, keepdim=True).clamp(min=0).detach()  # -inf rows: 0
    floor = torch.exp(-shift)
    centred = torch.exp(z - shift) - floor  # e^(z-m) - e^-m; invisible entries give -e^-m, dropped below
    numerator = zeros_where_not(torch.relu(centred), visible)
    denominator = zeros_where_not(centred.abs(), visible).sum(-1, keepdim=True) + eps * floor
    return numerator / denominator


def softpick_weights(scores, mask, eps=SOFTPICK_EPS, query_positions=None):
    """``ReLU(e^z - 1) / (sum_{j<=r} |e^z - 1| + eps)`` (default eps 1e-6)."""
    return softpick_map(scores, mask, eps)


def scalable_softpick_weights(scores, mask, s=SSMAX_S_INIT, eps=SOFTPICK_EPS, query_positions=None):
    """``softpick(s * log(n_r) * z)``; ``s`` a float or per-head ``[H]`` tensor (default 0.43, as SSMax)."""
    z = as_compute(scores)
    return softpick_map(scale_scores(z, log_length_scale(s, row_counts(mask, query_positions, z))), mask, eps)


def rectified_weights(scores, mask, query_positions=None):
    """Softmax over the visible entries with ``z >= 0``; a row with none is all zero."""
    z = as_compute(scores)
    return safe_softmax(z, mask & (z >= 0))


@register_attention("softpick", weights=softpick_weights, kernel="lengthbench.kernels.softpick:softpick_attention")
class SoftpickAttention(AttentionLayer):
    """Softpick (the paper "Softpick"): rectified softmax that need not sum to one; no attention sink."""

    def __init__(self, d_model, n_heads, pe, eps: float = SOFTPICK_EPS, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.eps = float(eps)

    def weights(self, scores, query_positions, x_rows):
        return softpick_weights(scores, causal_mask(query_positions, scores.shape[-1]), self.eps)

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes(), eps=self.eps)
        return self.reference_attend(q, k, v, x)


@register_attention("scalable-softpick", weights=scalable_softpick_weights)
class ScalableSoftpickAttention(LogLengthScaled):
    """Scalable-softpick (Softpick, Appendix C): softpick(s * log(n_r) * z), s learnable per head."""

    base_kernel = "softpick"

    def __init__(self, d_model, n_heads, pe, eps: float = SOFTPICK_EPS, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.eps = float(eps)

    def kernel_params(self):
        return {"eps": self.eps}

    def weight_function(self, scores, mask, query_positions, x_rows):
        return scalable_softpick_weights(scores, mask, self.s, self.eps, query_positions)

    def base_weights(self, z, mask):
        return softpick_weights(z, mask, self.eps)


@register_attention("rectified", weights=rectified_weights,
                    kernel="lengthbench.kernels.rectified:rectified_attention")
class RectifiedAttention(AttentionLayer):
    """Rectified-only softmax (Softpick, Appendix C): softmax over the non-negative scores only."""

    def weights(self, scores, query_positions, x_rows):
        return rectified_weights(scores, causal_mask(query_positions, scores.shape[-1]))

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes())
        return self.reference_attend(q, k, v, x)
