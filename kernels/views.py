"""Unit query and key views from the fused projections, in one kernel each way: the prologue of TDA's op.

``unit_views(qkv, qk2, heads, inv_freq)`` takes the ``qkv`` projection's output ``[B, T, 3 H D]`` (and, for a
second view, ``qk2``'s ``[B, T, 2 H D]``), rotates each query and key row by RoPE (inverse frequencies
``inv_freq``; None: no rotation), divides it by its norm (``F.normalize``, eps 1e-6) and returns
``q1, k1[, q2, k2], v`` as ``[B, H, T, D]``, contiguous, in the input's dtype: what the model's reference computes
with ``RoPE.rotate``, ``F.normalize`` and a copy per tensor. The backward maps the gradients of the views and of
``v`` to those of ``qkv`` and ``qk2`` in one kernel. The kernels compute in fp32 and round once, on the store;
RoPE's tables are rounded to the input's dtype, as the reference's are.

It is a custom op (``lengthbench::unit_views``) with its own backward: one node of the compiled training step each
way, capturable (no host sync). Compiled by Inductor, the same prologue, its backward and the views recomputed for
the op's backward took about 1.2 ms of TDA's 4.7 ms step on the paper MQMTAR model at batch 128; the op's two
kernels take 0.38 ms, and the step 3.9 ms (``benchmarks/step_profile.py``, H200, 2026-11-28, commits 0a0c661 and
ac1ca07: results/benchmarks/gpu_logs/step_profile_b128_unit_views.txt). ``kernels.UNIT_VIEWS`` chooses between the
two.
"""

import torch
import triton
import triton.language as tl

EPS = 1e-6  # F.normalize's default eps, as the models' ``unit``
# Launch tiles: token rows a program takes (of one head, a power of 2) and its warps, forward and backward.
# ``unit_views(tuning=...)`` overrides them (benchmarks/views_kernels.py compares tiles).
TILES = {"fwd": (32, 4), "bwd": (32, 4)}


def tiles(tuning: dict | None = None) -> list[int]:
    """``TILES`` with ``tuning``'s keys, as the op's argument ``[fwd rows, fwd warps, bwd rows, bwd warps]``."""
    tuning = dict(tuning or {})
    unknown = sorted(set(tuning) - set(TILES))
    if unknown:
        raise ValueError(f"unit_views tuning: unknown keys {unknown}; the keys are {sorted(TILES)}")
    out = []
    for key in ("fwd", "bwd"):
        rows, warps = tuning.get(key, TILES[key])
        if rows < 1 or rows & (rows - 1) or warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"unit_views tuning: {key} must be (rows, warps), rows a power of 2 and warps one of "
                             f"1, 2, 4, 8, 16; got {tuning[key]!r}")
        out += [int(rows), int(warps)]
    return out


@triton.jit
def _tile(COS, SIN, T, n_rows, D: tl.constexpr, HALF: tl.constexpr, ROPE: tl.constexpr, BR: tl.constexpr):
    """This program's token rows (``[BR]``: the rows, which are in range, their positions ``t`` and batches ``b``),
    the half-row offsets and load mask, and RoPE's cos and sin ``[BR, HALF]`` of the rows (1 and 0 without RoPE)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    row_ok = rows < n_rows
    offs_h = tl.arange(0, HALF)
    ok = row_ok[:, None] & (offs_h < D // 2)[None, :]
    t = rows % T
    c = tl.full([BR, HALF], 1.0, tl.float32)
    s = tl.zeros([BR, HALF], tl.float32)
    if ROPE:
        c = tl.load(COS + t[:, None] * (D // 2) + offs_h[None, :], mask=ok, other=0.0).to(tl.float32)
        s = tl.load(SIN + t[:, None] * (D // 2) + offs_h[None, :], mask=ok, other=0.0).to(tl.float32)
    return rows, row_ok, offs_h, ok, t, rows // T, c, s


@triton.jit
def _rotated(SRC, rows, offs_h, ok, W, slot, HD, h, D: tl.constexpr, HALF: tl.constexpr, c, s, ROPE: tl.constexpr):
    """One view's rows ``[BR, HALF]`` x 2 (the halves), rotated, in fp32."""
    base = SRC + rows.to(tl.int64)[:, None] * W + slot * HD + h * D + offs_h[None, :]
    lo = tl.load(base, mask=ok, other=0.0).to(tl.float32)
    hi = tl.load(base + D // 2, mask=ok, other=0.0).to(tl.float32)
    if ROPE:
        lo, hi = lo * c - hi * s, hi * c + lo * s
    return lo, hi


@triton.jit
def _forward_view(SRC, OUT, RINV, rows, t, b, offs_h, ok, row_ok, W, slot, view, HD, h, H, T, B,
                  D: tl.constexpr, HALF: tl.constexpr, c, s, ROPE: tl.constexpr, eps):
    lo, hi = _rotated(SRC, rows, offs_h, ok, W, slot, HD, h, D, HALF, c, s, ROPE)
    norm = tl.sqrt(tl.sum(lo * lo, 1) + tl.sum(hi * hi, 1))
    rinv = 1.0 / tl.maximum(norm, eps)
    head_row = (b.to(tl.int64) * H + h) * T + t
    dst = OUT + head_row[:, None] * D + offs_h[None, :]
    tl.store(dst, (lo * rinv[:, None]).to(OUT.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, (hi * rinv[:, None]).to(OUT.dtype.element_ty), mask=ok)
    tl.store(RINV + view * B * H * T + head_row, rinv, mask=row_ok)


@triton.jit
def _forward_kernel(QKV, QK2, COS, SIN, Q1, K1, Q2, K2, V, RINV, T, H, B, n_rows, eps,
                    D: tl.constexpr, HALF: tl.constexpr, TWO: tl.constexpr, ROPE: tl.constexpr, BR: tl.constexpr):
    h = tl.program_id(1)
    rows, row_ok, offs_h, ok, t, b, c, s = _tile(COS, SIN, T, n_rows, D, HALF, ROPE, BR)
    HD = H * D
    _forward_view(QKV, Q1, RINV, rows, t, b, offs_h, ok, row_ok, 3 * HD, 0, 0, HD, h, H, T, B, D, HALF, c, s, ROPE, eps)
    _forward_view(QKV, K1, RINV, rows, t, b, offs_h, ok, row_ok, 3 * HD, 1, 1, HD, h, H, T, B, D, HALF, c, s, ROPE, eps)
    if TWO:
        _forward_view(QK2, Q2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 0, 2, HD, h, H, T, B, D, HALF, c, s,
                      ROPE, eps)
        _forward_view(QK2, K2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 1, 3, HD, h, H, T, B, D, HALF, c, s,
                      ROPE, eps)
    # v: the copy to [B, H, T, D]
    head_row = (b.to(tl.int64) * H + h) * T + t
    src = QKV + rows.to(tl.int64)[:, None] * (3 * HD) + 2 * HD + h * D + offs_h[None, :]
    dst = V + head_row[:, None] * D + offs_h[None, :]
    tl.store(dst, tl.load(src, mask=ok, other=0.0), mask=ok)
    tl.store(dst + D // 2, tl.load(src + D // 2, mask=ok, other=0.0), mask=ok)


@triton.jit
def _backward_view(SRC, DY, DSRC, RINV, rows, t, b, offs_h, ok, row_ok, W, slot, view, HD, h, H, T, B,
                   D: tl.constexpr, HALF: tl.constexpr, c, s, ROPE: tl.constexpr, eps):
    """``d x = R^T (r (g - y <g, y>))`` where the norm exceeds eps (``y = r R x``), ``R^T r g`` where it was
    clamped; ``R`` the rotation, ``r`` the saved inverse norm."""
    lo, hi = _rotated(SRC, rows, offs_h, ok, W, slot, HD, h, D, HALF, c, s, ROPE)
    head_row = (b.to(tl.int64) * H + h) * T + t
    rinv = tl.load(RINV + view * B * H * T + head_row, mask=row_ok, other=0.0)
    dy = DY + head_row[:, None] * D + offs_h[None, :]
    g_lo = tl.load(dy, mask=ok, other=0.0).to(tl.float32)
    g_hi = tl.load(dy + D // 2, mask=ok, other=0.0).to(tl.float32)
    y_lo = lo * rinv[:, None]
    y_hi = hi * rinv[:, None]
    dot = tl.sum(g_lo * y_lo, 1) + tl.sum(g_hi * y_hi, 1)
    dot = tl.where(rinv < 1.0 / eps, dot, 0.0)  # a clamped norm is a constant
    d_lo = rinv[:, None] * (g_lo - y_lo * dot[:, None])
    d_hi = rinv[:, None] * (g_hi - y_hi * dot[:, None])
    if ROPE:
        d_lo, d_hi = d_lo * c + d_hi * s, d_hi * c - d_lo * s
    dst = DSRC + rows.to(tl.int64)[:, None] * W + slot * HD + h * D + offs_h[None, :]
    tl.store(dst, d_lo.to(DSRC.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, d_hi.to(DSRC.dtype.element_ty), mask=ok)


@triton.jit
def _backward_kernel(QKV, QK2, COS, SIN, DQ1, DK1, DQ2, DK2, DV, RINV, DQKV, DQK2, T, H, B, n_rows, eps,
                     D: tl.constexpr, HALF: tl.constexpr, TWO: tl.constexpr, ROPE: tl.constexpr, BR: tl.constexpr):
    h = tl.program_id(1)
    rows, row_ok, offs_h, ok, t, b, c, s = _tile(COS, SIN, T, n_rows, D, HALF, ROPE, BR)
    HD = H * D
    _backward_view(QKV, DQ1, DQKV, RINV, rows, t, b, offs_h, ok, row_ok, 3 * HD, 0, 0, HD, h, H, T, B, D, HALF, c, s,
                   ROPE, eps)
    _backward_view(QKV, DK1, DQKV, RINV, rows, t, b, offs_h, ok, row_ok, 3 * HD, 1, 1, HD, h, H, T, B, D, HALF, c, s,
                   ROPE, eps)
    if TWO:
        _backward_view(QK2, DQ2, DQK2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 0, 2, HD, h, H, T, B, D, HALF,
                       c, s, ROPE, eps)
        _backward_view(QK2, DK2, DQK2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 1, 3, HD, h, H, T, B, D, HALF,
                       c, s, ROPE, eps)
    head_row = (b.to(tl.int64) * H + h) * T + t
    src = DV + head_row[:, None] * D + offs_h[None, :]
    dst = DQKV + rows.to(tl.int64)[:, None] * (3 * HD) + 2 * HD + h * D + offs_h[None, :]
    tl.store(dst, tl.load(src, mask=ok, other=0.0).to(DQKV.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, tl.load(src + D // 2, mask=ok, other=0.0).to(DQKV.dtype.element_ty), mask=ok)


def _check(qkv: torch.Tensor, qk2: torch.Tensor | None, cos: torch.Tensor | None, heads: int) -> tuple[int, ...]:
    if qkv.dim() != 3 or qkv.shape[-1] % (3 * heads):
        raise ValueError(f"unit_views: qkv must be [B, T, 3 H D] with H = {heads}, got {tuple(qkv.shape)}")
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * heads)
    if head_dim % 2:
        raise ValueError(f"unit_views: the head dimension must be even, got {head_dim}")
    if qk2 is not None and tuple(qk2.shape) != (batch, tokens, 2 * heads * head_dim):
        raise ValueError(f"unit_views: qk2 must be [B, T, 2 H D] = {(batch, tokens, 2 * heads * head_dim)}, "
                         f"got {tuple(qk2.shape)}")
    if cos is not None and tuple(cos.shape) != (tokens, head_dim // 2):
        raise ValueError(f"unit_views: cos and sin must be [T, D / 2] = {(tokens, head_dim // 2)}, "
                         f"got {tuple(cos.shape)}")
    return batch, tokens, head_dim


def _launch(kernel, dims: tuple[int, ...], qkv, qk2, cos, sin, *tensors, heads: int, rows_per_program: int, warps: int):
    batch, tokens, head_dim = dims  # _check's
    rows = batch * tokens
    two = qk2 is not None
    rope = cos is not None
    dummy = qkv
    kernel[(triton.cdiv(rows, rows_per_program), heads)](
        qkv, qk2 if two else dummy, cos if rope else dummy, sin if rope else dummy, *tensors, tokens, heads, batch,
        rows, EPS, D=head_dim, HALF=triton.next_power_of_2(head_dim // 2), TWO=two, ROPE=rope, BR=rows_per_program,
        num_warps=warps)


@torch.library.custom_op("lengthbench::unit_views", mutates_args=())
def _unit_views(qkv: torch.Tensor, qk2: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
                heads: int, launch: list[int]) -> list[torch.Tensor]:
    batch, tokens, head_dim = dims = _check(qkv, qk2, cos, heads)
    qkv = qkv.contiguous()
    qk2 = None if qk2 is None else qk2.contiguous()
    cos = None if cos is None else cos.contiguous()
    sin = None if sin is None else sin.contiguous()
    n_views = 4 if qk2 is not None else 2
    shape = (batch, heads, tokens, head_dim)
    views = [qkv.new_empty(shape) for _ in range(n_views + 1)]  # the views, then v
    rinv = torch.empty((n_views, batch, heads, tokens), device=qkv.device, dtype=torch.float32)
    q1, k1, *rest = views
    q2, k2, v = rest if n_views == 4 else (qkv, qkv, rest[0])
    _launch(_forward_kernel, dims, qkv, qk2, cos, sin, q1, k1, q2, k2, v, rinv, heads=heads, rows_per_program=launch[0],
            warps=launch[1])
    return [*views, rinv]


@_unit_views.register_fake
def _(qkv, qk2, cos, sin, heads, launch):
    batch, tokens, head_dim = _check(qkv, qk2, cos, heads)
    n_views = 4 if qk2 is not None else 2
    shape = (batch, heads, tokens, head_dim)
    return [*(qkv.new_empty(shape) for _ in range(n_views + 1)),
            qkv.new_empty((n_views, batch, heads, tokens), dtype=torch.float32)]


@torch.library.custom_op("lengthbench::unit_views_backward", mutates_args=())
def _unit_views_backward(grads: list[torch.Tensor], qkv: torch.Tensor, qk2: torch.Tensor | None,
                         cos: torch.Tensor | None, sin: torch.Tensor | None, rinv: torch.Tensor,
                         heads: int, launch: list[int]) -> list[torch.Tensor]:
    qkv = qkv.contiguous()
    qk2 = None if qk2 is None else qk2.contiguous()
    cos = None if cos is None else cos.contiguous()
    sin = None if sin is None else sin.contiguous()
    grads = [g.contiguous() for g in grads]
    dqkv = torch.empty_like(qkv)
    dqk2 = torch.empty_like(qk2) if qk2 is not None else None
    dq1, dk1, *rest = grads
    dq2, dk2, dv = rest if qk2 is not None else (dq1, dq1, rest[0])
    _launch(_backward_kernel, _check(qkv, qk2, cos, heads), qkv, qk2, cos, sin, dq1, dk1, dq2, dk2, dv, rinv.contiguous(), dqkv,
            dqkv if dqk2 is None else dqk2, heads=heads, rows_per_program=launch[2], warps=launch[3])
    return [dqkv] if dqk2 is None else [dqkv, dqk2]


@_unit_views_backward.register_fake
def _(grads, qkv, qk2, cos, sin, rinv, heads, launch):
    return [torch.empty_like(qkv)] if qk2 is None else [torch.empty_like(qkv), torch.empty_like(qk2)]


def _setup_context(ctx, inputs, output):
    qkv, qk2, cos, sin, heads, launch = inputs
    ctx.heads = heads
    ctx.launch = launch
    ctx.two = qk2 is not None
    ctx.save_for_backward(qkv, qk2, cos, sin, output[-1])


def _backward(ctx, grads):
    qkv, qk2, cos, sin, rinv = ctx.saved_tensors
    views = [torch.zeros(rinv.shape[1:] + (qkv.shape[-1] // (3 * ctx.heads),), device=qkv.device, dtype=qkv.dtype)
             if g is None else g for g in grads[:-1]]  # the gradient of rinv (an output for the backward) is not used
    result = torch.ops.lengthbench.unit_views_backward(views, qkv, qk2, cos, sin, rinv, ctx.heads, ctx.launch)
    return result[0], (result[1] if ctx.two else None), None, None, None, None


_unit_views.register_autograd(_backward, setup_context=_setup_context)


def unit_views(qkv: torch.Tensor, qk2: torch.Tensor | None, heads: int, inv_freq: torch.Tensor | None = None,
               tuning: dict | None = None) -> tuple[torch.Tensor, ...]:
    """``(q1, k1[, q2, k2], v)`` ``[B, H, T, D]``: each view's query and key rows rotated by RoPE of inverse
    frequencies ``inv_freq`` ``[D / 2]`` at positions ``0 .. T-1`` (None: not rotated) and of unit norm, ``v`` as
    it is; differentiable in ``qkv`` and ``qk2``. RoPE's tables are rounded to the input's dtype, as
    ``RoPE.rotate``'s. ``tuning``: launch tiles in place of :data:`TILES`' (benchmarks, tests)."""
    launch = tiles(tuning)
    cos = sin = None
    if inv_freq is not None:
        angles = torch.arange(qkv.shape[1], device=qkv.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos().to(qkv.dtype), angles.sin().to(qkv.dtype)
    out = torch.ops.lengthbench.unit_views(qkv, qk2, cos, sin, heads, launch)
    return tuple(out[:-1])
