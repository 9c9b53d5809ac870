"""Rectified attention without normalisation: ReLA (Zhang et al. 2021), TRA and TDA (Threshold Differential
Attention, Sections 4.1-4.2).

All three leave the weights unnormalised and put an RMSNorm on each head's output instead. TRA and TDA
follow the paper (its Eq. 1 and Section 4.2): cosine scores ``s = <q/|q|, k/|k|>`` (minus the ALiBi distance
bias where the encoding has one), the length-dependent threshold

    tau_r = beta * sqrt(2 * max(0, log((n_r + c) / kappa)) / d),   a_rj = (s_rj - tau_r)_+ ^ p   (j <= r)

with ``n_r = r + 1`` the keys row ``r`` sees, ``beta`` learnable (a scalar per layer, start 1), ``kappa = 1``,
``p = 2``, and RMSNorm on the head output. The row index ``c``: ``tau_index="alg1"`` (the default, ``c = 0``)
is the paper's Algorithm 1 (``log((m + i + 1) / kappa)`` for 0-based row ``m + i``) and the authors' kernel
(snap-research/TDA ``triton_threshold_attention.py``: ``log(offs_m + 1)``), the form that produced the
published numbers; ``"eq1"`` (``c = 1``) is the paper's Eq. 1, ``log((i + 1) / kappa)`` for 1-based row
``i``: a higher threshold, by up to 0.5 in the first rows' weights. The authors' TDA normalises q and k by
default (``normalize=True``), as here; their kernel has neither kappa nor the output norm. TDA subtracts ``lambda`` times a second view's TRA weights (its own q/k projections, shared
values); ``lambda = sigmoid(lambda_logit)`` stays in (0, 1). The paper writes TDA's views without the power;
its experiments set ``p = 2`` for TRA and TDA alike, and so do we.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lengthbench.kernels.defaults import TDA_LAM, TRA_BETA, TRA_KAPPA, TRA_POWER, TRA_TAU_INDEX
from lengthbench.models.attention.base import (
    AttentionLayer,
    HeadRMSNorm,
    TwoViewAttention,
    as_compute,
    causal_mask,
    per_head,
    row_counts,
    zeros_where_not,
)
from lengthbench.models.attention.registry import register_attention


def rela_weights(scores, mask, query_positions=None):
    """``ReLU(z)`` over ``j <= r``, unnormalised."""
    return zeros_where_not(torch.relu(as_compute(scores)), mask)


TAU_INDEX_OFFSET = {"alg1": 0, "eq1": 1}  # added to n_r inside tau's log


def tra_threshold(counts: torch.Tensor, head_dim: int, beta=TRA_BETA, kappa: float = TRA_KAPPA,
                  tau_index: str = TRA_TAU_INDEX) -> torch.Tensor:
    """``tau_r = beta * sqrt(2 * max(0, log((n_r + c) / kappa)) / d)``, ``c`` 0 (``"alg1"``) or 1 (``"eq1"``);
    ``counts`` ``[Lq, 1]``."""
    if tau_index not in TAU_INDEX_OFFSET:
        raise ValueError(f"tau_index must be one of {', '.join(TAU_INDEX_OFFSET)}, got {tau_index!r}")
    log_count = torch.log((counts + TAU_INDEX_OFFSET[tau_index]) / kappa)
    return per_head(beta, counts) * torch.sqrt(2 * torch.clamp(log_count, min=0) / head_dim)



def tra_weights(scores, mask, head_dim=None, beta=TRA_BETA, kappa=TRA_KAPPA, power=TRA_POWER, query_positions=None,
                tau_index=TRA_TAU_INDEX):
    """``(s - tau_r)_+ ^ p`` for cosine scores ``s`` over ``j <= r``; ``head_dim`` is required (it sets the
    threshold), ``beta`` (default 1) a float or tensor, ``kappa`` 1, ``power`` 2, ``tau_index`` ``"alg1"``."""
    if head_dim is None:
        raise TypeError("tra weights need head_dim (the threshold scales with 1/sqrt(head_dim))")
    s = as_compute(scores)
    tau = tra_threshold(row_counts(mask, query_positions, s), head_dim, beta, kappa, tau_index)
    return zeros_where_not(torch.relu(s - tau) ** power, mask)


def tda_weights(scores, mask, scores2=None, head_dim=None, lam=TDA_LAM, beta=TRA_BETA, kappa=TRA_KAPPA,
                power=TRA_POWER, query_positions=None, tau_index=TRA_TAU_INDEX):
    """``tra(scores) - lam * tra(scores2)``: the effective map of two cosine-score views (``scores2``
    required, same shape); ``lam`` in (0, 1), default 0.5."""
    if scores2 is None:
        raise TypeError("tda weights need scores2, the cosine scores of the inhibitory view")
    first = tra_weights(scores, mask, head_dim, beta, kappa, power, query_positions, tau_index)
    second = tra_weights(scores2, mask, head_dim, beta, kappa, power, query_positions, tau_index)
    return first - per_head(lam, first) * second


@register_attention("rela", weights=rela_weights, kernel="lengthbench.kernels.rela:rela_attention")
class ReLAAttention(AttentionLayer):
    """ReLA (Zhang et al. 2021): ReLU(z) weights, unnormalised, RMSNorm on each head's output."""

    def __init__(self, d_model, n_heads, pe, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.head_norm = HeadRMSNorm(n_heads, self.head_dim)

    def weights(self, scores, query_positions, x_rows):
        return rela_weights(scores, causal_mask(query_positions, scores.shape[-1]))

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes())
        return self.reference_attend(q, k, v, x)

    def finish_heads(self, heads, x):
        return self.head_norm(heads)


class _Thresholded:
    """Shared by TRA and TDA: cosine scores (unit q and k, ``score_scale`` 1), beta, kappa, power, tau_index."""

    def _init_threshold(self, beta: float, kappa: float, power: float, tau_index: str):
        if tau_index not in TAU_INDEX_OFFSET:
            raise ValueError(f"tau_index must be one of {', '.join(TAU_INDEX_OFFSET)}, got {tau_index!r}")
        self.score_scale = 1.0
        self.beta = nn.Parameter(torch.tensor(float(beta)))
        self.kappa = float(kappa)
        self.power = float(power)
        self.tau_index = tau_index
        self.head_norm = HeadRMSNorm(self.n_heads, self.head_dim)

    def threshold_params(self) -> dict:
        return dict(beta=self.beta, kappa=self.kappa, power=self.power, tau_index=self.tau_index)

    def finish_heads(self, heads, x):
        return self.head_norm(heads)


def unit(t: torch.Tensor) -> torch.Tensor:
    return F.normalize(t, dim=-1, eps=1e-6)


@register_attention("tra", weights=tra_weights, kernel="lengthbench.kernels.tra:tra_attention")
class TRAAttention(_Thresholded, AttentionLayer):
    """Threshold rectified attention (Threshold Differential Attention, Section 4.1): cosine scores above a
    length-dependent threshold."""

    def __init__(self, d_model, n_heads, pe, beta: float = TRA_BETA, kappa: float = TRA_KAPPA,
                 power: float = TRA_POWER, tau_index: str = TRA_TAU_INDEX, **params):
        AttentionLayer.__init__(self, d_model, n_heads, pe, **params)
        self._init_threshold(beta, kappa, power, tau_index)

    def project(self, x):
        qkv = self.qkv(x)
        views = self.fused_views(qkv, norm=True)  # RoPE, the norms and the copies in one op each way
        if views is not None:
            return views
        q, k, v = self.split_qkv(qkv)
        return unit(q), unit(k), v

    def weights(self, scores, query_positions, x_rows):
        return tra_weights(scores, causal_mask(query_positions, scores.shape[-1]), self.head_dim,
                           query_positions=query_positions, **self.threshold_params())

    def attend(self, q, k, v, x):
        # The kernel gets unit q and k with sm_scale 1: its scores are the cosine scores.
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes(), sm_scale=1.0, **self.threshold_params())
        return self.reference_attend(q, k, v, x)


@register_attention("tda", weights=tda_weights, kernel="lengthbench.kernels.tda:tda_attention")
class TDAAttention(_Thresholded, TwoViewAttention):
    """Threshold differential attention (Threshold Differential Attention, Section 4.2): TRA of view 1 minus
    lambda times TRA of view 2."""

    def __init__(self, d_model, n_heads, pe, beta: float = TRA_BETA, kappa: float = TRA_KAPPA,
                 power: float = TRA_POWER, lambda_init: float = TDA_LAM, tau_index: str = TRA_TAU_INDEX, **params):
        TwoViewAttention.__init__(self, d_model, n_heads, pe, **params)
        self._init_threshold(beta, kappa, power, tau_index)
        if not 0 < lambda_init < 1:
            raise ValueError(f"tda lambda_init must lie in (0, 1), got {lambda_init}")
        self.lambda_logit = nn.Parameter(torch.tensor(math.log(lambda_init / (1 - lambda_init))))

    @property
    def lam(self) -> torch.Tensor:
        return torch.sigmoid(self.lambda_logit)

    def normalize_views(self, q, k):
        return unit(q), unit(k)

    def weights(self, scores, query_positions, x_rows):
        return tda_weights(scores[0], causal_mask(query_positions, scores.shape[-1]), scores[1], self.head_dim,
                           self.lam, query_positions=query_positions, **self.threshold_params())

    def kernel_names(self) -> tuple[str, ...]:
        return ("tda",)

    def forward(self, x):
        op = self.kernel("tda") if x.is_cuda else None
        if op is None:  # the reference: project (views concatenated per head), scores, weights
            return super().forward(x)
        qkv, qk2 = self.qkv(x), self.qk2(x)
        views = self.fused_views(qkv, qk2, norm=True)  # RoPE, the norms and the copies in one op each way
        if views is None:
            ((q1, k1), (q2, k2)), v = self.views_of(qkv, qk2)
        else:
            q1, k1, q2, k2, v = views
        # The one-pass op: both views per tile; its backward visits only the tiles with an active entry.
        heads = op(q1, k1, q2, k2, v, lam=self.lam, slopes=self.pe.slopes(), sm_scale=1.0, **self.threshold_params())
        return self.merge_heads(self.finish_heads(heads, x), x)


