"""Differential softmax attention (Ye et al. 2025), the baseline of Threshold Differential Attention.

``softmax(z1) - lambda * softmax(z2)`` with two sets of query/key projections and shared values (the
layout TDA uses; the original splits one head's projections in halves and doubles the value width).
As in Ye et al.: ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init`` with the four vectors
learnable (``head_dim`` each, start N(0, 0.1)), ``lambda_init = 0.8 - 0.6 exp(-0.3 l)`` for the layer
index ``l`` (0-based), and each head's output RMS-normalised then scaled by ``1 - lambda_init``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lengthbench.models.attention.base import (
    HeadRMSNorm,
    TwoViewAttention,
    causal_mask,
    per_head,
)
from lengthbench.models.attention.registry import register_attention
from lengthbench.models.attention.softmax import sdpa_attend, softmax_weights


def lambda_init(layer_index: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


def diffsoftmax_weights(scores, mask, scores2=None, lam=None, query_positions=None):
    """``softmax(scores) - lam * softmax(scores2)`` (``scores2`` required, same shape); ``lam`` defaults
    to the first layer's ``lambda_init`` (0.2)."""
    if scores2 is None:
        raise TypeError("diffsoftmax weights need scores2, the scores of the second view")
    lam = lambda_init(0) if lam is None else lam
    first = softmax_weights(scores, mask)
    return first - per_head(lam, first) * softmax_weights(scores2, mask)


@register_attention("diffsoftmax", weights=diffsoftmax_weights)
class DiffSoftmaxAttention(TwoViewAttention):
    """Differential softmax attention (Ye et al. 2025): difference of two softmax maps, per-head norm."""

    def __init__(self, d_model, n_heads, pe, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.lambda_q1 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
        self.lambda_k1 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
        self.lambda_q2 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
        self.lambda_k2 = nn.Parameter(torch.randn(self.head_dim) * 0.1)
        self.head_norm = HeadRMSNorm(n_heads, self.head_dim)

    @property
    def lambda_init(self) -> float:
        return lambda_init(getattr(self, "layer_index", 0))

    @property
    def lam(self) -> torch.Tensor:
        return (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1)) - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2))
                + self.lambda_init)

    def weights(self, scores, query_positions, x_rows):
        return diffsoftmax_weights(scores[0], causal_mask(query_positions, scores.shape[-1]), scores[1], self.lam)

    def attend(self, q, k, v, x):
        if not (q.is_cuda and self.use_kernels):
            return self.reference_attend(q, k, v, x)
        (q1, q2), (k1, k2) = self.split(q), self.split(k)
        slopes = self.pe.slopes()
        first = sdpa_attend(q1.contiguous(), k1.contiguous(), v, slopes)
        return first - self.lam.to(first.dtype) * sdpa_attend(q2.contiguous(), k2.contiguous(), v, slopes)

    def finish_heads(self, heads, x):
        return self.head_norm(heads) * (1 - self.lambda_init)
