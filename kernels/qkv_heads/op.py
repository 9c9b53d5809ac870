"""The query, key and value views of the fused projections, in one kernel each way: the prologue of every fused op.

``qkv_heads(qkv, qk2, heads, inv_freq, norm=...)`` takes the ``qkv`` projection's output ``[B, T, 3 H D]`` (or a
slice of a wider projection's rows: ASEntmax's, with its ``w_beta`` and ``w_gamma`` columns after them; and, for a
second view, ``qk2``'s ``[B, T, 2 H D]``), rotates each query and key row by RoPE (inverse frequencies ``inv_freq``;
None: no rotation), divides it by its norm where ``norm`` (``F.normalize``, eps 1e-6: TDA's and TRA's cosine scores)
and returns ``q1, k1[, q2, k2], v`` as ``[B, H, T, D]``, contiguous, in the input's dtype: what the model's reference
computes with ``RoPE.rotate``, ``F.normalize`` and a copy per tensor (``unit_views``: with the norm; ``head_views``:
one view without it). The backward maps the gradients of the views and of ``v`` to those of ``qkv`` and ``qk2`` in one
kernel; without the norm it is the gradients' rotation alone and keeps nothing of the forward but RoPE's tables. The
kernels compute in fp32 and round once, on the store; RoPE's tables are rounded to the input's dtype, as the
reference's are.

It is a custom op (``lengthbench::head_views``) with its own backward: one node of the compiled training step each
way, capturable (no host sync). The fused ops read ``[B, H, T, D]`` contiguous and give their gradients so; compiled
by Inductor, the model's prologue is a rotation, a copy to that layout, and their backward through a transposing
copy. For TDA, that prologue, its backward and the views recomputed for the op's backward took about 1.2 ms of its
4.7 ms step on the paper MQMTAR model at batch 128 (H200); the op's two kernels take 0.38 ms, and the step 3.9 ms.
At batch 128 with RoPE every other fused mechanism's training step gained 0.02-0.12 of softmax + RoPE's samples/s
on it. The attention modules take it wherever Triton runs (``lengthbench.kernels.qkv_heads_op``).
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
    """One view's rows ``[BR, HALF]`` x 2 (the halves), rotated, in fp32; ``W`` the source's row stride."""
    base = SRC + rows.to(tl.int64)[:, None] * W + slot * HD + h * D + offs_h[None, :]
    lo = tl.load(base, mask=ok, other=0.0).to(tl.float32)
    hi = tl.load(base + D // 2, mask=ok, other=0.0).to(tl.float32)
    if ROPE:
        lo, hi = lo * c - hi * s, hi * c + lo * s
    return lo, hi


@triton.jit
def _forward_view(SRC, OUT, RINV, rows, t, b, offs_h, ok, row_ok, W, slot, view, HD, h, H, T, B,
                  D: tl.constexpr, HALF: tl.constexpr, c, s, ROPE: tl.constexpr, NORM: tl.constexpr, eps):
    lo, hi = _rotated(SRC, rows, offs_h, ok, W, slot, HD, h, D, HALF, c, s, ROPE)
    head_row = (b.to(tl.int64) * H + h) * T + t
    if NORM:
        norm = tl.sqrt(tl.sum(lo * lo, 1) + tl.sum(hi * hi, 1))
        rinv = 1.0 / tl.maximum(norm, eps)
        lo = lo * rinv[:, None]
        hi = hi * rinv[:, None]
        tl.store(RINV + view * B * H * T + head_row, rinv, mask=row_ok)
    dst = OUT + head_row[:, None] * D + offs_h[None, :]
    tl.store(dst, lo.to(OUT.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, hi.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _forward_kernel(QKV, QK2, COS, SIN, Q1, K1, Q2, K2, V, RINV, T, H, B, n_rows, W, eps,
                    D: tl.constexpr, HALF: tl.constexpr, TWO: tl.constexpr, ROPE: tl.constexpr,
                    NORM: tl.constexpr, BR: tl.constexpr):
    h = tl.program_id(1)
    rows, row_ok, offs_h, ok, t, b, c, s = _tile(COS, SIN, T, n_rows, D, HALF, ROPE, BR)
    HD = H * D
    _forward_view(QKV, Q1, RINV, rows, t, b, offs_h, ok, row_ok, W, 0, 0, HD, h, H, T, B, D, HALF, c, s, ROPE, NORM,
                  eps)
    _forward_view(QKV, K1, RINV, rows, t, b, offs_h, ok, row_ok, W, 1, 1, HD, h, H, T, B, D, HALF, c, s, ROPE, NORM,
                  eps)
    if TWO:
        _forward_view(QK2, Q2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 0, 2, HD, h, H, T, B, D, HALF, c, s,
                      ROPE, NORM, eps)
        _forward_view(QK2, K2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 1, 3, HD, h, H, T, B, D, HALF, c, s,
                      ROPE, NORM, eps)
    # v: the copy to [B, H, T, D]
    head_row = (b.to(tl.int64) * H + h) * T + t
    src = QKV + rows.to(tl.int64)[:, None] * W + 2 * HD + h * D + offs_h[None, :]
    dst = V + head_row[:, None] * D + offs_h[None, :]
    tl.store(dst, tl.load(src, mask=ok, other=0.0), mask=ok)
    tl.store(dst + D // 2, tl.load(src + D // 2, mask=ok, other=0.0), mask=ok)


@triton.jit
def _backward_view(SRC, DY, DSRC, RINV, rows, t, b, offs_h, ok, row_ok, W, WD, slot, view, HD, h, H, T, B,
                   D: tl.constexpr, HALF: tl.constexpr, c, s, ROPE: tl.constexpr, NORM: tl.constexpr, eps):
    """``d x = R^T (r (g - y <g, y>))`` where the norm exceeds eps (``y = r R x``), ``R^T r g`` where it was
    clamped, ``R^T g`` without the norm; ``R`` the rotation, ``r`` the saved inverse norm. ``W``: the source's row
    stride, ``WD`` the gradient's."""
    head_row = (b.to(tl.int64) * H + h) * T + t
    dy = DY + head_row[:, None] * D + offs_h[None, :]
    d_lo = tl.load(dy, mask=ok, other=0.0).to(tl.float32)
    d_hi = tl.load(dy + D // 2, mask=ok, other=0.0).to(tl.float32)
    if NORM:
        lo, hi = _rotated(SRC, rows, offs_h, ok, W, slot, HD, h, D, HALF, c, s, ROPE)
        rinv = tl.load(RINV + view * B * H * T + head_row, mask=row_ok, other=0.0)
        y_lo = lo * rinv[:, None]
        y_hi = hi * rinv[:, None]
        dot = tl.sum(d_lo * y_lo, 1) + tl.sum(d_hi * y_hi, 1)
        dot = tl.where(rinv < 1.0 / eps, dot, 0.0)  # a clamped norm is a constant
        d_lo = rinv[:, None] * (d_lo - y_lo * dot[:, None])
        d_hi = rinv[:, None] * (d_hi - y_hi * dot[:, None])
    if ROPE:
        d_lo, d_hi = d_lo * c + d_hi * s, d_hi * c - d_lo * s
    dst = DSRC + rows.to(tl.int64)[:, None] * WD + slot * HD + h * D + offs_h[None, :]
    tl.store(dst, d_lo.to(DSRC.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, d_hi.to(DSRC.dtype.element_ty), mask=ok)


@triton.jit
def _backward_kernel(QKV, QK2, COS, SIN, DQ1, DK1, DQ2, DK2, DV, RINV, DQKV, DQK2, T, H, B, n_rows, W, eps,
                     D: tl.constexpr, HALF: tl.constexpr, TWO: tl.constexpr, ROPE: tl.constexpr,
                     NORM: tl.constexpr, BR: tl.constexpr):
    h = tl.program_id(1)
    rows, row_ok, offs_h, ok, t, b, c, s = _tile(COS, SIN, T, n_rows, D, HALF, ROPE, BR)
    HD = H * D
    _backward_view(QKV, DQ1, DQKV, RINV, rows, t, b, offs_h, ok, row_ok, W, 3 * HD, 0, 0, HD, h, H, T, B, D, HALF,
                   c, s, ROPE, NORM, eps)
    _backward_view(QKV, DK1, DQKV, RINV, rows, t, b, offs_h, ok, row_ok, W, 3 * HD, 1, 1, HD, h, H, T, B, D, HALF,
                   c, s, ROPE, NORM, eps)
    if TWO:
        _backward_view(QK2, DQ2, DQK2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 2 * HD, 0, 2, HD, h, H, T, B, D,
                       HALF, c, s, ROPE, NORM, eps)
        _backward_view(QK2, DK2, DQK2, RINV, rows, t, b, offs_h, ok, row_ok, 2 * HD, 2 * HD, 1, 3, HD, h, H, T, B, D,
                       HALF, c, s, ROPE, NORM, eps)
    head_row = (b.to(tl.int64) * H + h) * T + t
    src = DV + head_row[:, None] * D + offs_h[None, :]
    dst = DQKV + rows.to(tl.int64)[:, None] * (3 * HD) + 2 * HD + h * D + offs_h[None, :]
    tl.store(dst, tl.load(src, mask=ok, other=0.0).to(DQKV.dtype.element_ty), mask=ok)
    tl.store(dst + D // 2, tl.load(src + D // 2, mask=ok, other=0.0).to(DQKV.dtype.element_ty), mask=ok)


def _check(qkv: torch.Tensor, qk2: torch.Tensor | None, cos: torch.Tensor | None, heads: int) -> tuple[int, ...]:
    if qkv.dim() != 3 or qkv.shape[-1] % (3 * heads):
        raise ValueError(f"head_views: qkv must be [B, T, 3 H D] with H = {heads}, got {tuple(qkv.shape)}")
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * heads)
    if head_dim % 2:
        raise ValueError(f"head_views: the head dimension must be even, got {head_dim}")
    if qk2 is not None and tuple(qk2.shape) != (batch, tokens, 2 * heads * head_dim):
        raise ValueError(f"head_views: qk2 must be [B, T, 2 H D] = {(batch, tokens, 2 * heads * head_dim)}, "
                         f"got {tuple(qk2.shape)}")
    if cos is not None and tuple(cos.shape) != (tokens, head_dim // 2):
        raise ValueError(f"head_views: cos and sin must be [T, D / 2] = {(tokens, head_dim // 2)}, "
                         f"got {tuple(cos.shape)}")
    return batch, tokens, head_dim


def _rows(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` ``[B, T, W]`` as the kernels read it: rows at one stride, each row's entries adjacent (a slice of a
    wider projection's rows, ASEntmax's, is read in place); else a contiguous copy."""
    if t is None:
        return None
    if t.stride(-1) == 1 and t.stride(0) == t.shape[1] * t.stride(1):
        return t
    return t.contiguous()


def _launch(kernel, dims: tuple[int, ...], qkv, qk2, cos, sin, *tensors, heads: int, two: bool, norm: bool,
            rows_per_program: int, warps: int):
    """``qkv`` and ``qk2``: the sources (None where the kernel does not read them: the backward without the norm)."""
    batch, tokens, head_dim = dims  # _check's
    rows = batch * tokens
    rope = cos is not None
    dummy = tensors[0]
    kernel[(triton.cdiv(rows, rows_per_program), heads)](
        dummy if qkv is None else qkv, dummy if qk2 is None else qk2, cos if rope else dummy, sin if rope else dummy,
        *tensors, tokens, heads, batch, rows, 0 if qkv is None else qkv.stride(1), EPS, D=head_dim,
        HALF=triton.next_power_of_2(head_dim // 2), TWO=two, ROPE=rope, NORM=norm, BR=rows_per_program,
        num_warps=warps)


def _tables(cos, sin):
    return (None, None) if cos is None else (cos.contiguous(), sin.contiguous())


@torch.library.custom_op("lengthbench::head_views", mutates_args=())
def _head_views(qkv: torch.Tensor, qk2: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
                heads: int, norm: bool, launch: list[int]) -> list[torch.Tensor]:
    batch, tokens, head_dim = dims = _check(qkv, qk2, cos, heads)
    qkv, qk2 = _rows(qkv), None if qk2 is None else qk2.contiguous()
    cos, sin = _tables(cos, sin)
    n_views = 4 if qk2 is not None else 2
    shape = (batch, heads, tokens, head_dim)
    views = [qkv.new_empty(shape) for _ in range(n_views + 1)]  # the views, then v
    rinv = torch.empty((n_views if norm else 0, batch, heads, tokens), device=qkv.device, dtype=torch.float32)
    q1, k1, *rest = views
    q2, k2, v = rest if n_views == 4 else (q1, q1, rest[0])
    _launch(_forward_kernel, dims, qkv, qk2, cos, sin, q1, k1, q2, k2, v, rinv if norm else q1, heads=heads,
            two=qk2 is not None, norm=norm, rows_per_program=launch[0], warps=launch[1])
    return [*views, rinv]


@_head_views.register_fake
def _(qkv, qk2, cos, sin, heads, norm, launch):
    batch, tokens, head_dim = _check(qkv, qk2, cos, heads)
    n_views = 4 if qk2 is not None else 2
    shape = (batch, heads, tokens, head_dim)
    return [*(qkv.new_empty(shape) for _ in range(n_views + 1)),
            qkv.new_empty((n_views if norm else 0, batch, heads, tokens), dtype=torch.float32)]


def _gradient_shapes(grads) -> tuple[tuple[int, ...], ...]:
    """The shapes of the gradients of ``qkv`` (and ``qk2``) from those of the views and ``v``."""
    batch, heads, tokens, head_dim = grads[0].shape
    width = heads * head_dim
    return ((batch, tokens, 3 * width),) + (((batch, tokens, 2 * width),) if len(grads) == 5 else ())


@torch.library.custom_op("lengthbench::head_views_backward", mutates_args=())
def _head_views_backward(grads: list[torch.Tensor], sources: list[torch.Tensor], cos: torch.Tensor | None,
                         sin: torch.Tensor | None, rinv: torch.Tensor, launch: list[int]) -> list[torch.Tensor]:
    """``sources``: ``qkv`` (and ``qk2``) where the views were normalised (their backward reads them), else empty."""
    norm = bool(sources)
    heads = grads[0].shape[1]
    out = [grads[0].new_empty(shape) for shape in _gradient_shapes(grads)]
    dqkv, *rest = out
    dqk2 = rest[0] if rest else dqkv
    qkv, qk2 = (_rows(sources[0]), sources[1].contiguous() if len(sources) == 2 else None) if norm else (None, None)
    two = len(grads) == 5
    dims = (dqkv.shape[0], dqkv.shape[1], grads[0].shape[-1])
    if norm:
        _check(qkv, qk2, cos, heads)
    cos, sin = _tables(cos, sin)
    grads = [g.contiguous() for g in grads]
    dq1, dk1, *more = grads
    dq2, dk2, dv = more if two else (dq1, dq1, more[0])
    _launch(_backward_kernel, dims, qkv, qk2, cos, sin, dq1, dk1, dq2, dk2, dv, rinv.contiguous() if norm else dq1,
            dqkv, dqk2, heads=heads, two=two, norm=norm,
            rows_per_program=launch[2], warps=launch[3])
    return out


@_head_views_backward.register_fake
def _(grads, sources, cos, sin, rinv, launch):
    return [grads[0].new_empty(shape) for shape in _gradient_shapes(grads)]


def _setup_context(ctx, inputs, output):
    qkv, qk2, cos, sin, heads, norm, launch = inputs
    ctx.launch = launch
    ctx.two = qk2 is not None
    ctx.head_shape = tuple(output[0].shape)
    # without the norm the backward is the gradients' rotation alone: the projections are not kept for it
    ctx.save_for_backward(cos, sin, output[-1], *((qkv, qk2) if norm else ()))


def _backward(ctx, grads):
    cos, sin, rinv, *sources = ctx.saved_tensors
    sources = [t for t in sources if t is not None]
    dtype = next((g.dtype for g in grads[:-1] if g is not None), rinv.dtype)
    views = [torch.zeros(ctx.head_shape, device=rinv.device, dtype=dtype) if g is None else g
             for g in grads[:-1]]  # the gradient of rinv (an output for the backward) is not used
    result = torch.ops.lengthbench.head_views_backward(views, sources, cos, sin, rinv, ctx.launch)
    return result[0], (result[1] if ctx.two else None), None, None, None, None, None


_head_views.register_autograd(_backward, setup_context=_setup_context)


def qkv_heads(qkv: torch.Tensor, qk2: torch.Tensor | None, heads: int, inv_freq: torch.Tensor | None = None, *,
                norm: bool, tuning: dict | None = None) -> tuple[torch.Tensor, ...]:
    """:func:`unit_views` where ``norm``, else the views as they are (:func:`head_views`, with a second view where
    ``qk2``)."""
    launch = tiles(tuning)
    cos = sin = None
    if inv_freq is not None:
        angles = torch.arange(qkv.shape[1], device=qkv.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos().to(qkv.dtype), angles.sin().to(qkv.dtype)
    out = torch.ops.lengthbench.head_views(qkv, qk2, cos, sin, heads, norm, launch)
    return tuple(out[:-1])


def unit_views(qkv: torch.Tensor, qk2: torch.Tensor | None, heads: int, inv_freq: torch.Tensor | None = None,
               tuning: dict | None = None) -> tuple[torch.Tensor, ...]:
    """``(q1, k1[, q2, k2], v)`` ``[B, H, T, D]``: each view's query and key rows rotated by RoPE of inverse
    frequencies ``inv_freq`` ``[D / 2]`` at positions ``0 .. T-1`` (None: not rotated) and of unit norm, ``v`` as
    it is; differentiable in ``qkv`` and ``qk2``. RoPE's tables are rounded to the input's dtype, as
    ``RoPE.rotate``'s. ``tuning``: launch tiles in place of :data:`TILES`' (benchmarks, tests)."""
    return qkv_heads(qkv, qk2, heads, inv_freq, norm=True, tuning=tuning)


def head_views(qkv: torch.Tensor, heads: int, inv_freq: torch.Tensor | None = None,
               tuning: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` ``[B, H, T, D]``, contiguous: :func:`unit_views` of one view without the norm (what
    ``AttentionLayer.split_qkv`` computes). ``qkv`` may be a slice of a wider projection's rows."""
    return qkv_heads(qkv, None, heads, inv_freq, norm=False, tuning=tuning)
