"""Stick-breaking attention (Tan et al. 2025) and Sieve attention (Sieve Attention, Section 3; Algorithm 1's window).

Both allocate over the earlier keys ``j < r``, most recent first. Stick-breaking puts what is left of the stick on
the query's own value (the diagonal), so every row sums to one (Tan et al.'s reference; some copies drop the
remainder, we keep it, as ATTENTION.md says):

    a_j = sigmoid(z_j) * prod_{j < k < r} (1 - sigmoid(z_k))   for j < r,     a_r = prod_{j < r} (1 - sigmoid(z_j))

computed in log space: ``log a_j = z_j - sum_{j <= k < r} softplus(z_k)``, the sum a reversed cumulative
sum (accumulated from the most recent key backwards, so the weights that matter lose no precision).
Sieve Attention filters the earlier keys before the stick is broken; its text and its Algorithm 1 describe two
filters:

- ``sieve`` is the paper's definition (Section 3, Eqs. 5-7): the candidates are the support of alpha-entmax over
  ``z_{j<r}`` (alpha 1.5, the value its Figure 4 ablation found best), the stick is broken by the candidates only,
  and the weights outside them are exact zeros; no gradient flows through the support (Eq. 7 uses the support,
  not the entmax values, so a key outside it gets neither weight nor gradient). Eq. 7 weighs the earlier tokens
  only, so the remainder goes nowhere (``remainder="drop"``, the default; a row sums to ``1 - prod_{j in S} (1 -
  sigmoid(z_j))``, row 0 to zero); ``remainder="diagonal"`` puts it on the query's own value as above.
- ``sieve-window`` is the filter of its Algorithm 1 (Appendix C), read literally: it keeps the earlier keys with
  ``z >= max_{j<r} z - eps``, every earlier key breaks the stick (line 17 accumulates the softplus of all keys),
  and the weights outside the filter are set to zero (their mass is dropped; the remainder ``prod_{j<r} (1 -
  sigmoid(z_j))`` stays on the diagonal); no gradient flows through the filter. ``eps`` defaults to 2, the
  narrowest window that holds every 1.5-entmax support (``lengthbench.kernels.defaults.SIEVE_WINDOW_EPS``); with
  eps 8 and 4 layers it learned MQRAR (docs/reproduction.md, Sieve Attention Table 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lengthbench.kernels.defaults import REMAINDERS, SIEVE_ALPHA, SIEVE_REMAINDER, SIEVE_WINDOW_EPS
from lengthbench.models.attention.base import (
    AttentionLayer,
    as_compute,
    causal_mask,
    diagonal_and_earlier,
)
from lengthbench.models.attention.entmax import KERNEL_ALPHA, entmax_map
from lengthbench.models.attention.registry import register_attention


def stick_break(z: torch.Tensor, active: torch.Tensor, diagonal: torch.Tensor,
                remainder: bool = True) -> torch.Tensor:
    """Stick-breaking over the ``active`` keys of each row (later keys break first), the remainder on the
    ``diagonal`` (or, ``remainder=False``, nowhere); zero elsewhere. ``-inf`` scores take nothing; no NaN in value
    or gradient."""
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    z_active = torch.where(active, z, zero)
    log_keep = torch.where(active, F.softplus(z_active), zero)  # -log(1 - sigmoid(z)) per active key
    suffix = log_keep.flip(-1).cumsum(-1).flip(-1)  # sum over active k >= j
    log_weights = torch.where(active, z_active - suffix, zero)
    weights = torch.where(active, torch.exp(log_weights), zero)
    if not remainder:
        return weights
    left = torch.exp(-log_keep.sum(-1, keepdim=True))
    return weights + torch.where(diagonal, left, zero)


def check_remainder(remainder: str) -> None:
    """Refuse a ``remainder`` other than those of :data:`REMAINDERS`, naming them."""
    if remainder not in REMAINDERS:
        raise ValueError(f"unknown remainder {remainder!r}; choose from: {', '.join(REMAINDERS)}")


def stickbreaking_weights(scores, mask, query_positions=None, remainder="diagonal"):
    """Stick-breaking over ``j < r`` with the remainder on ``j = r`` (rows sum to one), or, ``remainder="drop"``,
    over ``j < r`` only (rows sum to ``1 - prod_{j<r} (1 - sigmoid(z_j))``)."""
    check_remainder(remainder)
    z = as_compute(scores)
    diagonal, earlier = diagonal_and_earlier(mask, query_positions)
    return stick_break(z, earlier, diagonal, remainder == "diagonal")


def sieve_support(z: torch.Tensor, earlier: torch.Tensor, alpha: float = SIEVE_ALPHA) -> torch.Tensor:
    """The support (bool) of alpha-entmax over the earlier keys, without gradient."""
    with torch.no_grad():
        return entmax_map(z.detach(), earlier, alpha) > 0


def sieve_weights(scores, mask, alpha=SIEVE_ALPHA, query_positions=None, remainder=SIEVE_REMAINDER):
    """Sieve (Section 3): stick-breaking over the support of alpha-entmax(z_{j<r}) (default alpha 1.5), exact zeros
    outside the support; the remainder nowhere (``remainder="drop"``, the default: Eq. 7 as printed, rows sum to
    ``1 - prod_{j in S} (1 - sigmoid(z_j))``) or on ``j = r`` (``"diagonal"``: rows sum to one)."""
    check_remainder(remainder)
    z = as_compute(scores)
    diagonal, earlier = diagonal_and_earlier(mask, query_positions)
    return stick_break(z, earlier & sieve_support(z, earlier, alpha), diagonal, remainder == "diagonal")


def sieve_window_weights(scores, mask, eps=SIEVE_WINDOW_EPS, query_positions=None):
    """Sieve's Algorithm 1 window: stick-breaking over all ``j < r``, weights kept where ``z_j >= max_{k<r} z_k -
    eps`` (default eps 2; no gradient through the filter), the remainder on ``j = r``."""
    z = as_compute(scores)
    diagonal, earlier = diagonal_and_earlier(mask, query_positions)
    with torch.no_grad():
        rowmax = torch.where(earlier, z.detach(), torch.full((), float("-inf"), dtype=z.dtype,
                                                            device=z.device)).amax(-1, keepdim=True)
        keep = (earlier & (z.detach() >= rowmax - float(eps))) | diagonal
    w = stick_break(z, earlier, diagonal)
    return torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device))


@register_attention("stickbreaking", weights=stickbreaking_weights,
                    kernel="lengthbench.kernels.stickbreaking:stickbreaking_attention")
class StickBreakingAttention(AttentionLayer):
    """Stick-breaking attention (Tan et al. 2025): recency-biased. What is left of the stick goes on the query's
    own value (``remainder="diagonal"``, the default: Tan et al.'s reference) or nowhere (``"drop"``: the weights
    of Sieve Attention's Eq. 7, over the earlier tokens only, and what the stick-breaking layer of the Sparse
    Attention authors' code (deep-spin/asentmax) computes: it drops the remainder its kernel returns). The fused
    kernel computes the default; ``"drop"`` runs the dense reference everywhere."""

    def __init__(self, d_model, n_heads, pe, remainder: str = "diagonal", **params):
        super().__init__(d_model, n_heads, pe, **params)
        check_remainder(remainder)
        self.remainder = remainder

    def weights(self, scores, query_positions, x_rows):
        return stickbreaking_weights(scores, causal_mask(query_positions, scores.shape[-1]), query_positions,
                                     self.remainder)

    def kernel_names(self) -> tuple[str, ...]:
        return (self.name,) if self.kernel_supported() else ()

    def kernel_supported(self) -> bool:
        return self.remainder == "diagonal"

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda and self.kernel_supported() else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes())
        return self.reference_attend(q, k, v, x)


@register_attention("sieve", weights=sieve_weights, kernel="lengthbench.kernels.sieve:sieve_attention")
class SieveAttention(AttentionLayer):
    """Sieve attention (Sieve Attention, Section 3): entmax-support filter, then stick-breaking over the survivors.
    What is left of the stick goes nowhere (``remainder="drop"``, the default: Eq. 7 as printed, whose weights cover
    the earlier tokens only) or on the query's own value (``"diagonal"``); the fused kernel computes both."""

    def __init__(self, d_model, n_heads, pe, alpha: float = SIEVE_ALPHA, remainder: str = SIEVE_REMAINDER,
                 **params):
        super().__init__(d_model, n_heads, pe, **params)
        check_remainder(remainder)
        self.alpha = float(alpha)
        self.remainder = remainder

    def weights(self, scores, query_positions, x_rows):
        return sieve_weights(scores, causal_mask(query_positions, scores.shape[-1]), self.alpha, query_positions,
                             self.remainder)

    def kernel_supported(self) -> bool:
        return self.alpha == KERNEL_ALPHA

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda and self.kernel_supported() else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes(), alpha=self.alpha, remainder=self.remainder)
        return self.reference_attend(q, k, v, x)


@register_attention("sieve-window", weights=sieve_window_weights,
                    kernel="lengthbench.kernels.sieve:sieve_window_attention")
class SieveWindowAttention(AttentionLayer):
    """Sieve's Algorithm 1 window (Sieve Attention, Appendix C): keys within eps of the row's max, stick broken by
    every key."""

    def __init__(self, d_model, n_heads, pe, eps: float = SIEVE_WINDOW_EPS, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.eps = float(eps)

    def weights(self, scores, query_positions, x_rows):
        return sieve_window_weights(scores, causal_mask(query_positions, scores.shape[-1]), self.eps,
                                    query_positions)

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes(), eps=self.eps)
        return self.reference_attend(q, k, v, x)
