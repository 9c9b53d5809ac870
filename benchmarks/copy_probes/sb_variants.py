"""Stick-breaking probe variants for Copy (plugins: LENGTHBENCH_PLUGINS=sb_variants, with this folder on
PYTHONPATH). Dense references only: for CPU probes at small n."""
import torch

from lengthbench.models.attention import AttentionLayer, causal_mask, register_attention
from lengthbench.models.attention.base import as_compute, diagonal_and_earlier
from lengthbench.models.attention.stickbreaking import stick_break


@register_attention("sb-drop")
class StickBreakingDropped(AttentionLayer):
    """Stick-breaking over j < r with the remainder dropped: rows sum to 1 - prod_{j<r} (1 - sigmoid(z_j)), and
    no query sees its own value. This is how the stick-breaking path of seed 003's authors' public code calls
    Tan et al.'s kernel (it discards the returned remainder; its decoding step reads keys j < r only)."""

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        w = stick_break(as_compute(scores), earlier, diagonal)
        return torch.where(diagonal, torch.zeros((), dtype=w.dtype, device=w.device), w)


@register_attention("sb-self")
class StickBreakingSelf(AttentionLayer):
    """Stick-breaking over j <= r, the query's own key the most recent (it breaks the stick first), the remainder
    dropped: rows sum to 1 - prod_{j<=r} (1 - sigmoid(z_j)). This is Tan et al.'s Triton kernel with its
    ``attend_current=True`` flag (its default, False, is ``sb-drop``)."""

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        return stick_break(as_compute(scores), earlier | diagonal, torch.zeros_like(diagonal))


@register_attention("sb-norm")
class StickBreakingNormalised(AttentionLayer):
    """Stick-breaking over j < r, each row divided by its sum (the remainder shared out in proportion, not put on
    the diagonal); the first row, with no earlier key, attends to itself."""

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        diagonal, earlier = diagonal_and_earlier(mask, query_positions)
        w = stick_break(as_compute(scores), earlier, torch.zeros_like(diagonal))
        total = w.sum(-1, keepdim=True)
        none = ~earlier.any(-1, keepdim=True)
        return torch.where(none, diagonal.to(w.dtype), w / total.clamp_min(torch.finfo(w.dtype).tiny))
