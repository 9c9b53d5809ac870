"""The attention sublayer every mechanism shares, and its dense, query-chunked reference path.

A mechanism is an :class:`AttentionLayer` subclass registered by name with its weight function
(``register_attention`` in ``registry.py``). The simplest ones only give a
weight function (``weights``); the layer computes raw scores ``z = q.k / sqrt(d) - slope_h (r - j)``,
hands each block of query rows to it, and multiplies by the values. Query blocks keep memory at
O(query_chunk x L), so a CPU can evaluate 65,536-token sequences; the result equals the unchunked path.

Weight functions (the dense references, ``WEIGHT_FUNCTIONS``) have the signature ``fn(scores, mask, **params)``: ``scores``
``[..., Lq, Lk]``, ``mask`` the causal visibility ``[Lq, Lk]`` (bool, row r sees keys ``j <= r``).
Mechanisms whose weights depend on the query's position take an optional ``query_positions`` ``[Lq]``;
without it the position of row i is read off the mask (its last visible key), which for a square map is
``i`` and for the last ``Lq`` rows of a longer one is ``i + Lk - Lq``. They compute in float32, or in
float64 when given float64 (so that ``gradcheck`` works), return exact zeros where masked, and never NaN.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from lengthbench.kernels import qkv_heads_op
from lengthbench.models.positional import PositionalEncoding, RoPE

WeightFunction = Callable[..., torch.Tensor]
VIEWS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the views op (kernels/qkv_heads/op.py) takes


def causal_mask(query_positions: torch.Tensor, n_keys: int) -> torch.Tensor:
    """``[Lq, n_keys]`` bool: key ``j`` is visible to the query at position ``r`` iff ``j <= r``."""
    keys = torch.arange(n_keys, device=query_positions.device)
    return keys[None, :] <= query_positions[:, None]


def visible_counts(query_positions: torch.Tensor) -> torch.Tensor:
    """``n_r = r + 1``, the keys visible to each query, as float ``[Lq, 1]``."""
    return (query_positions + 1).to(torch.float32)[:, None]


# -- helpers shared by the weight functions --------------------------------------------------------------
def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (gradcheck); everything else is computed in float32."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def as_compute(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(compute_dtype(tensor))


def row_positions(mask: torch.Tensor, query_positions: torch.Tensor | None = None) -> torch.Tensor:
    """The position ``r`` of each query row ``[Lq]``: given, or the last key the causal mask shows it."""
    if query_positions is not None:
        return query_positions.to(mask.device)
    return mask.sum(-1) - 1


def row_counts(mask: torch.Tensor, query_positions: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``n_r = r + 1`` as ``[Lq, 1]`` in the dtype of ``like``."""
    return (row_positions(mask, query_positions) + 1).to(like.dtype)[:, None]


def diagonal_and_earlier(mask: torch.Tensor, query_positions: torch.Tensor | None):
    """``(diagonal, earlier)`` bool ``[Lq, Lk]``: key ``j == r`` and keys ``j < r`` visible to row ``r``."""
    positions = row_positions(mask, query_positions)
    keys = torch.arange(mask.shape[-1], device=mask.device)
    diagonal = keys[None, :] == positions[:, None]
    return diagonal, mask & (keys[None, :] < positions[:, None])


def per_head(value, like: torch.Tensor):
    """A per-head parameter (float, 0-d or ``[H]`` tensor) shaped to broadcast over ``[..., H, Lq, Lk]``."""
    if not torch.is_tensor(value):
        return value
    value = value.to(like.dtype)
    return value[:, None, None] if value.dim() == 1 else value


def per_row(value, like: torch.Tensor):
    """A per-query-row parameter (float, or ``[..., Lq]`` tensor) shaped to broadcast over ``[..., Lq, Lk]``."""
    if not torch.is_tensor(value):
        return value
    value = value.to(like.dtype)
    return value.unsqueeze(-1) if value.dim() >= 1 else value


def zeros_where_not(weights: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))


def safe_softmax(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax over the ``visible`` entries; exact zeros elsewhere; a row with nothing visible (or only
    ``-inf`` scores) is all zero rather than NaN."""
    z = z.masked_fill(~visible, float("-inf"))
    has_any = torch.isfinite(z).any(-1, keepdim=True)
    z = torch.where(has_any, z, torch.zeros((), dtype=z.dtype, device=z.device))
    return zeros_where_not(torch.softmax(z, dim=-1), visible & has_any)


def masked_fill_zero(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact zeros outside the mask (and no NaN leaking from masked entries)."""
    return zeros_where_not(weights, mask)


class HeadRMSNorm(nn.Module):
    """RMSNorm of each head's output over its ``head_dim`` channels, with a learnable gain per head."""

    def __init__(self, n_heads: int, head_dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n_heads, 1, head_dim))

    def forward(self, heads: torch.Tensor) -> torch.Tensor:  # [B, H, T, head_dim]
        h = as_compute(heads)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.to(h.dtype)).to(heads.dtype)


def _call_kernel(op, *tensors, **kwargs):
    """``op`` on its positional tensors cast to the last one's dtype and contiguous, here, where a compiled model
    traces the casts and copies and fuses them with the work before them (the op itself is a graph break)."""
    dtype = tensors[-1].dtype
    return op(*(t.to(dtype).contiguous() for t in tensors), **kwargs)


class AttentionLayer(nn.Module, abc.ABC):
    """Multi-head causal self-attention: ``x [B, T, d_model] -> [B, T, d_model]``.

    Subclasses set ``name`` (by registering) and define ``weights`` (a map of one score matrix, the one abstract
    method), and override ``scores``/``attend`` where the mechanism needs more (two views, an output norm, a
    gate). A subclass without ``weights`` is abstract: ``register_attention`` refuses it where it is defined (the
    class statement under the decorator raises ``TypeError``), and creating one raises ``TypeError`` too.
    ``query_chunk`` (None: all rows at once) bounds the memory of the reference path; ``use_kernels``
    lets a mechanism call its fused kernel on CUDA, ``capturable`` with the launch settings a CUDA graph records.
    """

    name: ClassVar[str] = "abstract"

    def __init__(self, d_model: int, n_heads: int, pe: PositionalEncoding, **params):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by {n_heads} heads")
        if params:
            raise ValueError(f"attention {self.name!r} takes no parameter {sorted(params)[0]!r}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.pe = pe
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.query_chunk: int | None = None
        self.use_kernels = True
        # While a training step is recorded into a CUDA graph (lengthbench/graph_step.py): the fused ops as nodes of
        # its compiled graph, with the launch settings a graph can record (kernel_tuning, by op name:
        # lengthbench.compile_policy.CAPTURE_TUNING).
        self.capturable = False
        self.kernel_tuning: dict[str, dict] = {}
        # Multiplies q.k in the raw scores; cosine-score mechanisms (tra, tda) set 1.
        self.score_scale = 1.0 / math.sqrt(self.head_dim)

    # -- the pieces a mechanism may override -------------------------------------------------------
    def project(self, x: torch.Tensor):
        """``q, k, v`` as ``[B, H, T, head_dim]``, positions applied."""
        return self.split_qkv(self.qkv(x))

    def split_qkv(self, qkv: torch.Tensor):
        """``q, k, v`` as ``[B, H, T, head_dim]`` from the ``qkv`` projection's output ``[B, T, 3 d_model]`` (or a
        slice of a wider one's rows), positions applied."""
        views = self.fused_views(qkv)
        if views is not None:
            return views
        batch, tokens, _ = qkv.shape
        q, k, v = qkv.view(batch, tokens, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        positions = torch.arange(tokens, device=qkv.device)
        q, k = self.pe.rotate(q, k, positions)
        return q, k, v

    def score_matrix(self, q_rows: torch.Tensor, k: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
        """``score_scale * q.k - slope_h (r - j)`` as ``[B, H, Lq, Lk]`` (float32, or float64)."""
        dtype = compute_dtype(q_rows)
        # Outside autocast: under the runner's bf16 autocast (CUDA) the product would come back rounded to bf16
        # (a relative 2^-9), where the fused kernels keep their fp32 accumulator; models training on these
        # references (``trains_dense``) would then learn on coarser scores than they are scored with.
        with torch.autocast(q_rows.device.type, enabled=False):
            z = torch.matmul(q_rows.to(dtype), k.to(dtype).transpose(-1, -2)) * self.score_scale
        slopes = self.pe.slopes()
        if slopes is not None:
            distance = query_positions[:, None] - torch.arange(k.shape[-2], device=k.device)[None, :]
            z = z - slopes.to(device=z.device, dtype=dtype)[:, None, None] * distance.to(dtype)
        return z

    def scores(self, q_rows: torch.Tensor, k: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
        """Raw scores ``[B, H, Lq, Lk]`` (float32) of the query rows at ``query_positions`` against keys
        ``0 .. Lk-1``; the causal mask is not applied here."""
        return self.score_matrix(q_rows, k, query_positions)

    @abc.abstractmethod
    def weights(self, scores: torch.Tensor, query_positions: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        """The weight map ``[B, H, Lq, Lk]`` of the mechanism for these raw scores; zero where masked."""

    def attend(self, q, k, v, x) -> torch.Tensor:
        """Per-head outputs ``[B, H, T, head_dim]``. Mechanisms with a kernel dispatch here."""
        return self.reference_attend(q, k, v, x)

    def finish_heads(self, heads: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Hook on the per-head outputs before they are merged (output norms, gates)."""
        return heads

    # -- shared machinery --------------------------------------------------------------------------
    def fused_views(self, qkv: torch.Tensor, qk2: torch.Tensor | None = None, norm: bool = False):
        """``(q1, k1[, q2, k2], v)`` ``[B, H, T, head_dim]``, contiguous, from the projections' outputs by the op of
        ``kernels/qkv_heads/op.py`` (RoPE, unit norms where ``norm``, the copies: one kernel each way), or None where the
        model's own prologue computes them: off CUDA, for an encoding whose rotation the op does not compute, or in a module that calls no fused op (SDPA reads the rows in place)."""
        if not (qkv.is_cuda and qkv.dtype in VIEWS_DTYPES) or not self.dispatches_to_kernel():
            return None
        op = qkv_heads_op()
        rotation = self.views_rotation()
        if op is None or rotation is False:
            return None
        return op(qkv, qk2, self.n_heads, rotation, norm=norm)

    def views_rotation(self):
        """What ``kernels/qkv_heads/op.py`` rotates the views by for this encoding: RoPE's inverse frequencies, None (an
        encoding that does not rotate), or False where the op cannot apply it (an encoding with its own rotation,
        a subclass of RoPE's included): the model's prologue then."""
        rotate = type(self.pe).rotate
        if rotate is PositionalEncoding.rotate:
            return None
        return self.pe.inv_freq if rotate is RoPE.rotate else False

    def kernel(self, name: str | None = None):
        """The fused op registered for ``name`` (default: this mechanism; ``register_attention(..., kernel=op)``), or
        None."""
        if not self.use_kernels:
            return None
        from lengthbench.models.attention.registry import get_kernel

        # in the recorded training step, the op is a node of the compiled graph (no graph break around it)
        name = name or self.name
        op = get_kernel(name, tuning=self.kernel_tuning.get(name), in_graph=self.capturable)
        return None if op is None else functools.partial(_call_kernel, op)

    def kernel_names(self) -> tuple[str, ...]:
        """The fused ops this module may call on CUDA (each call is a graph break in a compiled model)."""
        return (self.name,)

    def kernel_supported(self) -> bool:
        """Whether this module's parameters are ones its fused op computes (else a CUDA forward runs the dense
        reference); the sweep's cost model asks it too."""
        return True

    def dispatches_to_kernel(self) -> bool:
        """Whether a forward on CUDA may call a fused op here; decided without loading the ops, so that a forward
        that torch.compile traces may ask (:meth:`fused_views`) without a graph break."""
        if not self.use_kernels:
            return False
        from lengthbench.models.attention.registry import has_kernel

        return any(has_kernel(name) for name in self.kernel_names())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.merge_heads(self.finish_heads(self.attend(q, k, v, x), x), x)

    def merge_heads(self, heads: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The output projection of the per-head outputs ``[B, H, T, head_dim]``, in the dtype of ``x``."""
        batch, tokens, _ = x.shape
        return self.out(heads.transpose(1, 2).reshape(batch, tokens, self.d_model).to(x.dtype))

    def reference_attend(self, q, k, v, x) -> torch.Tensor:
        tokens = q.shape[-2]
        chunk = self.query_chunk or tokens
        outputs = []
        for start in range(0, tokens, chunk):
            stop = min(tokens, start + chunk)
            positions = torch.arange(start, stop, device=q.device)
            w = self.weights(self.scores(q[:, :, start:stop], k[:, :, :stop], positions), positions,
                             x[:, start:stop])
            outputs.append(torch.matmul(w, v[:, :, :stop].to(w.dtype)))
        return torch.cat(outputs, dim=2).to(v.dtype)

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Weights ``[B, H, len(rows), T]`` of the query rows ``rows`` (default: all) over all keys.

        Only the requested rows are computed (memory O(len(rows) x T)), for diagnostics and plots.
        Mechanisms whose output is not one weight map (e.g. two views) return their effective map.
        """
        q, k, _ = self.project(x)
        if rows is None:
            rows = torch.arange(x.shape[1], device=x.device)
        rows = rows.to(x.device)
        return self.weights(self.scores(q[:, :, rows], k, rows), rows, x[:, rows])


class TwoViewAttention(AttentionLayer):
    """Two sets of query/key projections sharing the values (differential mechanisms: tda,
    diffsoftmax). ``project`` returns each of q and k as the two views concatenated on the last axis;
    ``scores`` returns them stacked ``[2, B, H, Lq, Lk]``; ``weights`` combines them into one map."""

    def __init__(self, d_model: int, n_heads: int, pe: PositionalEncoding, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.qk2 = nn.Linear(d_model, 2 * d_model, bias=False)

    def normalize_views(self, q, k):
        """Hook applied to each view's rotated q and k (cosine mechanisms normalise them)."""
        return q, k

    def views(self, x: torch.Tensor):
        """``((q1, k1), (q2, k2)), v``, each ``[B, H, T, head_dim]``."""
        return self.views_of(self.qkv(x), self.qk2(x))

    def views_of(self, qkv: torch.Tensor, qk2: torch.Tensor):
        """:meth:`views` from the projections' outputs ``[B, T, 3 d_model]`` and ``[B, T, 2 d_model]``."""
        batch, tokens, _ = qkv.shape
        q1, k1, v = qkv.view(batch, tokens, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q2, k2 = qk2.view(batch, tokens, 2, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        positions = torch.arange(tokens, device=qkv.device)
        view1 = self.normalize_views(*self.pe.rotate(q1, k1, positions))
        view2 = self.normalize_views(*self.pe.rotate(q2, k2, positions))
        return (view1, view2), v

    def project(self, x):
        ((q1, k1), (q2, k2)), v = self.views(x)
        return torch.cat([q1, q2], dim=-1), torch.cat([k1, k2], dim=-1), v

    def split(self, t: torch.Tensor):
        return t[..., : self.head_dim], t[..., self.head_dim :]

    def scores(self, q_rows, k, query_positions):
        (q1, q2), (k1, k2) = self.split(q_rows), self.split(k)
        return torch.stack([self.score_matrix(q1, k1, query_positions), self.score_matrix(q2, k2, query_positions)])
