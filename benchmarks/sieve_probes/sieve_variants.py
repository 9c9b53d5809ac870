"""Sieve probe variants (plugins). All: keys j<r, remainder on the diagonal unless noted."""
import torch

from lengthbench.models.attention import AttentionLayer, causal_mask, register_attention
from lengthbench.models.attention.base import as_compute, diagonal_and_earlier
from lengthbench.models.attention.stickbreaking import sieve_support, stick_break


def _zero_outside(w, keep):
    return torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device))


@register_attention("sieve-temp")
class SieveTemp(AttentionLayer):
    """Sieve with a wider filter: support of 1.5-entmax(z / T) over j<r, stick over the support."""

    def __init__(self, d_model, n_heads, pe, T: float = 2.0, alpha: float = 1.5, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.T, self.alpha = float(T), float(alpha)

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        z = as_compute(scores)
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        keep = sieve_support(z / self.T, earlier, self.alpha)
        return stick_break(z, earlier & keep, diagonal)


@register_attention("sieve-eps")
class SieveEps(AttentionLayer):
    """Algorithm 1's filter: keep j<r with z >= rowmax_{j<r} - eps. masked=0: stick over kept keys only;
    masked=1: stick broken by all earlier keys, weights zeroed outside the kept set."""

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
