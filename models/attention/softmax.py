"""Softmax attention, ``softmax(z)`` over the visible keys ``j <= r``, and gated softmax attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lengthbench.models.attention.base import (
    WEIGHT_FUNCTIONS,
    AttentionLayer,
    as_compute,
    causal_mask,
    safe_softmax,
)
from lengthbench.models.attention.registry import register_attention

# Query rows per SDPA call when a distance bias forces an explicit mask: O(chunk x L) memory.
SDPA_BIAS_CHUNK = 2048


@WEIGHT_FUNCTIONS.register("softmax")
def softmax_weights(scores: torch.Tensor, mask: torch.Tensor, query_positions=None) -> torch.Tensor:
    """``softmax(z)`` over ``j <= r``; a row whose visible scores are all ``-inf`` is all zero."""
    return safe_softmax(as_compute(scores), mask)


def sdpa_attend(q, k, v, slopes: torch.Tensor | None, scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention through torch SDPA (CUDA), with an ALiBi bias where ``slopes`` is set."""
    if slopes is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    tokens = q.shape[-2]
    outputs = []
    for start in range(0, tokens, SDPA_BIAS_CHUNK):
        stop = min(tokens, start + SDPA_BIAS_CHUNK)
        positions = torch.arange(start, stop, device=q.device)
        distance = (positions[:, None] - torch.arange(stop, device=q.device)[None, :]).to(q.dtype)
        bias = -slopes.to(q.dtype)[:, None, None] * distance
        bias = bias.masked_fill(distance < 0, float("-inf"))
        outputs.append(F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop],
                                                      attn_mask=bias.unsqueeze(0), scale=scale))
    return torch.cat(outputs, dim=2)


@register_attention("softmax")
class SoftmaxAttention(AttentionLayer):
    """Softmax attention (the baseline of every seed); torch SDPA on CUDA."""

    def weights(self, scores, query_positions, x_rows):
        return softmax_weights(scores, causal_mask(query_positions, scores.shape[-1]))

    def attend(self, q, k, v, x):
        if not (q.is_cuda and self.use_kernels):
            return self.reference_attend(q, k, v, x)
        return sdpa_attend(q, k, v, self.pe.slopes())


# The gate acts on the head outputs, not on the map: the reference map of `gated` is softmax's.
WEIGHT_FUNCTIONS.register("gated")(softmax_weights)


@register_attention("gated")
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
