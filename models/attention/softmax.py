"""Softmax attention, ``softmax(z)`` over the visible keys ``j <= r``, and gated softmax attention."""

from __future__ import annotations

import torch
from torch import nn

from lengthbench.kernels.utils.sdpa import SDPA_BIAS_CHUNK, sdpa_attend  # noqa: F401 (re-exported)
from lengthbench.models.attention.base import (
    AttentionLayer,
    as_compute,
    causal_mask,
    safe_softmax,
)
from lengthbench.models.attention.registry import register_attention


def softmax_weights(scores: torch.Tensor, mask: torch.Tensor, query_positions=None) -> torch.Tensor:
    """``softmax(z)`` over ``j <= r``; a row whose visible scores are all ``-inf`` is all zero."""
    return safe_softmax(as_compute(scores), mask)


@register_attention("softmax", weights=softmax_weights)
class SoftmaxAttention(AttentionLayer):
    """Softmax attention (the baseline of every paper); torch SDPA on CUDA."""

    def weights(self, scores, query_positions, x_rows):
        return softmax_weights(scores, causal_mask(query_positions, scores.shape[-1]))

    def attend(self, q, k, v, x):
        if not (q.is_cuda and self.use_kernels):
            return self.reference_attend(q, k, v, x)
        return sdpa_attend(q, k, v, self.pe.slopes())


# The gate acts on the head outputs, not on the map: the reference map of `gated` is softmax's.
@register_attention("gated", weights=softmax_weights)
class GatedAttention(SoftmaxAttention):
    """Gated softmax attention (Qiu et al. 2025): head outputs times ``sigmoid(x W_g)``.

    The gate is the paper's best variant: elementwise (one gate per head and channel), query-dependent,
    applied to the attention output before the output projection.
    """

    def __init__(self, d_model, n_heads, pe, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.gate = nn.Linear(d_model, d_model, bias=False)

    def finish_heads(self, heads, x):
        batch, tokens, _ = x.shape
        gate = torch.sigmoid(self.gate(x)).view(batch, tokens, self.n_heads, self.head_dim).transpose(1, 2)
        return heads * gate.to(heads.dtype)
