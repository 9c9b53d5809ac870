"""Sieve probe variants (plugins). All: keys j<r, remainder on the diagonal unless noted."""
import torch

from lengthbench.models.attention import AttentionLayer, causal_mask, register_attention
from lengthbench.models.attention.base import as_compute, diagonal_and_earlier
from lengthbench.models.attention.stickbreaking import sieve_support, stick_break


def _zero_outside(w, keep):
    return torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device))


@register_attention("sieve-temp")
class SieveTemp(AttentionLayer):
    """Sieve with a wider filter: support of 1.5-entmax(z / T) over j<r, stick over the support. The support of
    1.5-entmax lies within 2 of the row's maximum (``z / 2 - tau <= 1``), so this one lies within ``2 T`` of it:
    ``T`` 4 is as wide as ``sieve-alg1``'s eps 8, the width MQRAR's inline variant needs (session 26).

    On CUDA (alpha 1.5) it runs the tested kernels: entmax's threshold of ``z / T`` and the stick-breaking
    forward and backward with Sieve's filter (``_sieve_temp_op``), so it evaluates at 65,536 tokens; elsewhere
    its dense reference."""

    def __init__(self, d_model, n_heads, pe, T: float = 2.0, alpha: float = 1.5, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.T, self.alpha = float(T), float(alpha)

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        z = as_compute(scores)
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        keep = sieve_support(z / self.T, earlier, self.alpha)
        return stick_break(z, earlier & keep, diagonal)

    def kernel_names(self):
        return ("sieve",)  # the ops sieve_temp_op calls are Sieve's: the runner must not compile around them

    def attend(self, q, k, v, x):
        if q.is_cuda and self.alpha == 1.5 and self.kernel("sieve") is not None:
            return sieve_temp_op(q, k, v, slopes=self.pe.slopes(), T=self.T)
        return self.reference_attend(q, k, v, x)


@torch.compiler.disable
def sieve_temp_op(q, k, v, *, slopes=None, T=2.0, sm_scale=None):
    """``sieve-temp`` through the fused kernels: Sieve's filter is ``z / 2 > tau`` with ``tau`` T times the
    1.5-entmax threshold of ``z / T`` over ``j < r`` (that support is ``z / (2 T) > tau_T``)."""
    from lengthbench.kernels.entmax import entmax_threshold
    from lengthbench.kernels.stickbreaking import StickBreakingAttention

    q, k = q.to(v.dtype), k.to(v.dtype)
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    scaled_slopes = None if slopes is None else slopes / T  # z / T, the ALiBi bias included
    tau = entmax_threshold(q, k, slopes=scaled_slopes, sm_scale=sm_scale / T, strict=True) * T
    return StickBreakingAttention.apply(q, k, v, slopes, None, tau, sm_scale, False)


@register_attention("sieve-eps")
class SieveEps(AttentionLayer):
    """Algorithm 1's filter: keep j<r with z >= rowmax_{j<r} - eps. masked=0: stick over kept keys only;
    masked=1: stick broken by all earlier keys, weights zeroed outside the kept set.

    On CUDA it runs ``sieve-alg1``'s tested kernels (the row maximum, then the stick-breaking forward and
    backward with the window as the filter; ``masked`` picks which keys break the stick), so it evaluates at
    65,536 tokens; elsewhere its dense reference."""

    def __init__(self, d_model, n_heads, pe, eps: float = 2.0, masked: float = 0.0, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.eps, self.masked = float(eps), bool(float(masked))

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        z = as_compute(scores)
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        with torch.no_grad():
            neg = torch.full((), float("-inf"), dtype=z.dtype, device=z.device)
            rowmax = torch.where(earlier, z, neg).amax(-1, keepdim=True)
            keep = earlier & (z >= rowmax - self.eps)
        if self.masked:
            w = stick_break(z, earlier, diagonal)
            return _zero_outside(w, keep | diagonal)
        return stick_break(z, keep, diagonal)

    def kernel_names(self):
        return ("sieve-alg1",)  # the op attend calls: the runner must not compile around it

    def attend(self, q, k, v, x):
        op = self.kernel("sieve-alg1") if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes(), eps=self.eps, masked=self.masked)
        return self.reference_attend(q, k, v, x)


class _AlphaSieve(AttentionLayer):
    """A probe with the entmax filter's alpha as its one parameter; subclasses pick the weights."""

    def __init__(self, d_model, n_heads, pe, alpha: float = 1.5, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.alpha = float(alpha)

    def split(self, scores, query_positions):
        """``(mask, z, diagonal, earlier)`` of the score rows."""
        mask = causal_mask(query_positions, scores.shape[-1])
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        return mask, as_compute(scores), diagonal, earlier


@register_attention("sieve-diag")
class SieveDiag(_AlphaSieve):
    """Sieve whose entmax filter row includes the diagonal key (j<=r); stick still over S minus r."""

    def weights(self, scores, query_positions, x_rows):
        mask, z, diagonal, earlier = self.split(scores, query_positions)
        keep = sieve_support(z, mask, self.alpha)
        return stick_break(z, earlier & keep, diagonal)


@register_attention("sieve-st")
class SieveST(_AlphaSieve):
    """Straight-through: forward exactly Sieve, backward the gradient of stick-breaking over all j<r."""

    def weights(self, scores, query_positions, x_rows):
        _, z, diagonal, earlier = self.split(scores, query_positions)
        sb = stick_break(z, earlier, diagonal)
        sv = stick_break(z, earlier & sieve_support(z, earlier, self.alpha), diagonal)
        return sb + (sv - sb).detach()


@register_attention("sieve-bias")
class SieveBias(AttentionLayer):
    """Sieve with a learnable per-head bias b_h added to the stick's scores only. The entmax filter is
    shift-invariant, so b_h does not change the support; it lets the stick be sharp (sigmoid(z+b)~1)
    without stretching the content spread of z that the filter sees."""

    def __init__(self, d_model, n_heads, pe, alpha: float = 1.5, b0: float = 0.0, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.alpha = float(alpha)
        self.stick_bias = torch.nn.Parameter(torch.full((n_heads,), float(b0)))

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        z = as_compute(scores)
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        keep = sieve_support(z, earlier, self.alpha)
        return stick_break(z + self.stick_bias.to(z.dtype)[:, None, None], earlier & keep, diagonal)


@register_attention("sb-bias")
class StickBias(AttentionLayer):
    """Control: plain stick-breaking over all j<r with the same learnable per-head bias."""

    def __init__(self, d_model, n_heads, pe, b0: float = 0.0, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.stick_bias = torch.nn.Parameter(torch.full((n_heads,), float(b0)))

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        z = as_compute(scores)
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        return stick_break(z + self.stick_bias.to(z.dtype)[:, None, None], earlier, diagonal)
