"""Softmax attention: ``softmax(z)`` over the visible keys ``j <= r``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lengthbench.models.attention.base import WEIGHT_FUNCTIONS, AttentionLayer, causal_mask
from lengthbench.models.attention.registry import register_attention


@WEIGHT_FUNCTIONS.register("softmax")
def softmax_weights(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    z = scores.float().masked_fill(~mask, float("-inf"))
    return torch.softmax(z, dim=-1)


@register_attention("softmax")
class SoftmaxAttention(AttentionLayer):
    # Query rows per SDPA call when a distance bias forces an explicit mask: O(chunk x L) memory.
    bias_chunk = 2048

    def weights(self, scores, query_positions, x_rows):
        return softmax_weights(scores, causal_mask(query_positions, scores.shape[-1]))

    def attend(self, q, k, v, x):
        if not (q.is_cuda and self.use_kernels):
            return self.reference_attend(q, k, v, x)
        slopes = self.pe.slopes()
        if slopes is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        tokens = q.shape[-2]
        outputs = []
        for start in range(0, tokens, self.bias_chunk):
            stop = min(tokens, start + self.bias_chunk)
            positions = torch.arange(start, stop, device=q.device)
            distance = (positions[:, None] - torch.arange(stop, device=q.device)[None, :]).to(q.dtype)
            bias = -slopes.to(q.dtype)[:, None, None] * distance
            bias = bias.masked_fill(distance < 0, float("-inf"))
            outputs.append(F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop],
                                                          attn_mask=bias.unsqueeze(0)))
        return torch.cat(outputs, dim=2)
