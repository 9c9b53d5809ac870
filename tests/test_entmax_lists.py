"""The list forward of entmax and sparsemax attention (``kernels/entmax/op.py``, ``_lists_forward``; ``kernels/entmax/lists.py``) and of Sieve
(``kernels/sieve/op.py``): against the float64 dense reference (output, and gradients through the unchanged
backward of ``RowwiseAttention`` / ``StickBreakingAttention``), against the forward over all keys (``tuning={"lists":
False}``: the threshold, then the output pass over all keys), and which rows it finishes from their lists.

Runs on a CUDA GPU (fp32 and bf16) or on the CPU under the Triton interpreter (``TRITON_INTERPRET=1``, fp32
only: the interpreter's bf16 dot products are wrong), with the references, error measure and tolerances of
``test_kernels.py``.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

triton = pytest.importorskip("triton")  # CPU-only installs (CI) have no Triton: the kernels do not import there
tl = triton.language

from test_kernels import TOL_GRAD, TOL_OUT, dense_scores, rel_err, tie_rows  # noqa: E402

from lengthbench.kernels.entmax import lists as entmax_lists  # noqa: E402
from lengthbench.kernels.entmax import op as entmax  # noqa: E402
from lengthbench.kernels.entmax import threshold as search  # noqa: E402
from lengthbench.kernels.entmax.config import launch_config  # noqa: E402
from lengthbench.kernels.sieve import op as sieve  # noqa: E402
from lengthbench.kernels.utils import open_rows  # noqa: E402
from lengthbench.kernels.utils.common import Problem  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
pytestmark = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
ALPHA = {"entmax": 1.5, "sparsemax": 2.0, "sieve": 1.5}


def op_of(name, tuning=None):
    """The op of ``name`` with the launch settings ``tuning`` (None: the defaults)."""
    if name == "sieve":
        return lambda *args, **kwargs: sieve.sieve_attention(*args, tuning=tuning, **kwargs)
    return lambda *args, **kwargs: entmax.entmax_attention(*args, alpha=ALPHA[name], tuning=tuning, **kwargs)


def make(batch, heads, tokens, head_dim, dtype, seed, scale=1.0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, device=DEVICE, generator=gen) for _ in range(3))
    return (q * scale).to(dtype), (k * scale).to(dtype), v.to(dtype)


def alibi(heads, batch, tokens, seed, big=False):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    slopes = torch.tensor([0.5, 0.0625, 0.0][:heads], device=DEVICE)
    if big:  # every earlier key far below the diagonal: supports of one key
        slopes = torch.full((heads,), 8.0, device=DEVICE)
    return slopes, 0.5 + torch.rand(batch, heads, tokens, device=DEVICE, generator=gen)


def path_counts(name, q, k, v, slopes=None, row_scale=None, tuning=None):
    """``(listed, total, ncand, lists)``: the rows the list forward finishes from their lists."""
    pb = Problem(q, k, v, slopes, row_scale, None)
    if name == "sieve":
        _, ncand, _ = sieve._lists_forward(pb, False, tuning)
        return int((ncand > 0).sum()), ncand.numel(), ncand, None
    *_, ncand, lists = entmax._lists_forward(pb, ALPHA[name], False, tuning=tuning)
    return int((ncand > 0).sum()), ncand.numel(), ncand, lists


def check(name, q, k, v, *, slopes=None, row_scale=None, seed=0, label="", tuning=None):
    """The op (default: the list forward; ``tuning``: other launch settings) against the float64 reference, as
    ``test_kernels.check``; returns the errors."""
    from lengthbench import attention_weights

    dtype = q.dtype
    op = op_of(name, tuning)
    sm_scale = 1.0 / math.sqrt(q.shape[-1])
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    extras = {}
    if slopes is not None:
        extras["slopes"] = slopes.detach().clone().requires_grad_()
    if row_scale is not None:
        extras["row_scale"] = row_scale.detach().clone().requires_grad_()
    out = op(*leaves, sm_scale=sm_scale, **extras)
    assert out.shape == q.shape and out.dtype == dtype
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_extras = {key: t.detach().double().requires_grad_() for key, t in extras.items()}
    z = dense_scores(*ref_leaves[:2], sm_scale, ref_extras.get("slopes"), ref_extras.get("row_scale"))
    ref_out = torch.matmul(attention_weights(name, z), ref_leaves[2])
    ties = tie_rows(name, z.detach(), q, k, sm_scale, extras.get("slopes"), extras.get("row_scale"))
    assert ties.float().mean().item() <= 0.05
    keep = ~ties
    assert torch.isfinite(out).all(), "NaN/inf in the output"
    errors = {"out": rel_err(out[keep], ref_out[keep])}
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    dout = torch.randn(out.shape, device=DEVICE, generator=gen, dtype=torch.float64) * keep[..., None]
    (out.double() * dout).sum().backward()
    (ref_out * dout).sum().backward()
    names = ["dq", "dk", "dv"] + [f"d{key}" for key in extras]
    for label_, a, b in zip(names, leaves + list(extras.values()), ref_leaves + list(ref_extras.values()),
                            strict=True):
        assert a.grad is not None and torch.isfinite(a.grad).all(), f"{label_}: missing or non-finite"
        errors[label_] = rel_err(a.grad, b.grad)
    print(f"ERR lists {name:10s} {label:30s} ties={int(ties.sum())} "
          + " ".join(f"{key}={val:.2e}" for key, val in errors.items()))
    assert errors["out"] <= TOL_OUT[dtype], errors
    for key, val in errors.items():
        assert val <= TOL_GRAD[dtype], (key, errors)
    return errors


# (tokens, head_dim): the interpreter is slow, so the longer rows at one head dim
SHAPES = [(1, 32), (17, 32), (64, 32), (100, 16), (100, 32), (100, 64), (300, 32)]
if CUDA:
    SHAPES += [(300, 16), (300, 64), (1000, 32), (4096, 32), (333, 128), (4096, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}-D{s[1]}")
@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_match_reference(name, shape, dtype):
    tokens, head_dim = shape
    q, k, v = make(2 if tokens < 100 else 1, 2, tokens, head_dim, dtype, seed=tokens + head_dim)
    check(name, q, k, v, seed=tokens, label=f"T={tokens} D={head_dim} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_slopes_and_row_scale(name, dtype):
    batch, heads, tokens = 1, 3, 150
    q, k, v = make(batch, heads, tokens, 32, dtype, seed=7)
    slopes, row_scale = alibi(heads, batch, tokens, seed=3)
    check(name, q, k, v, slopes=slopes, row_scale=row_scale, label=f"slopes+row_scale {dtype}")


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_single_key_supports(name):
    """Steep slopes: every row's support is its own key alone (a causal row always sees its diagonal, so no
    row has nothing visible here; those are the strict rows of Sieve, which keeps the old path)."""
    q, k, v = make(1, 2, 130, 32, torch.float32, seed=9)
    slopes, row_scale = alibi(2, 1, 130, seed=4, big=True)
    check(name, q, k, v, slopes=slopes, row_scale=row_scale, label="one-key supports")
    out = op_of(name)(q, k, v, slopes=slopes, row_scale=row_scale)
    if name == "sieve":  # the one earlier key in the support takes sigmoid(z) of the stick
        return
    torch.testing.assert_close(out, v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_near_uniform_scores(name):
    """Tiny scores (near-ties everywhere, wide supports): most rows go to the open path."""
    q, k, v = make(1, 2, 200, 32, torch.float32, seed=12, scale=0.05)
    listed, total, *_ = path_counts(name, q, k, v)
    assert listed < total // 2, (listed, total)
    check(name, q, k, v, seed=2, label="near-uniform")


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_large_scores(name):
    """Scores of magnitude ~50: finite, and still the reference."""
    q, k, v = make(1, 2, 300, 32, torch.float32, seed=5, scale=2.7)
    check(name, q, k, v, seed=5, label="large scores")


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_overflowing_rows_go_open(name):
    """With lists of 8 slots, rows of more candidates are left open, and the output is still the reference."""
    q, k, v = make(1, 2, 300, 32, torch.float32, seed=21, scale=0.6)
    listed_64, total, *_ = path_counts(name, q, k, v)
    listed_8, _, ncand, _ = path_counts(name, q, k, v, tuning=dict(list_size=8))
    assert 0 < listed_8 < listed_64 <= total, (listed_8, listed_64, total)
    assert int(ncand.max()) <= 8
    check(name, q, k, v, seed=21, label="lists of 8", tuning=dict(list_size=8))


@pytest.mark.parametrize("name", ["entmax", "sparsemax"])
def test_lists_hold_the_support(name):
    """Certified rows take the list path (most rows of N(0, 1) scores), open rows the other; each listed row's
    keys are distinct, visible and hold the row's support (from the dense float64 threshold)."""
    from lengthbench import attention_weights

    tokens = 600
    q, k, v = make(1, 2, tokens, 32, torch.float32, seed=31)
    listed, total, ncand, lists = path_counts(name, q, k, v)
    print(f"listed {listed} of {total}; candidates max {int(ncand.max())}")
    assert listed >= 0.9 * total, (listed, total)
    z = dense_scores(q.double(), k.double(), 1.0 / math.sqrt(32), None, None)
    support = attention_weights(name, z) > 0  # [1, 2, T, T]
    support = support.reshape(-1, tokens, tokens)
    ncand = ncand.cpu()
    for bh in range(support.shape[0]):
        for row in range(tokens):
            n = int(ncand[bh, row])
            if n == 0:
                continue
            keys = lists[bh, row, :n].cpu()
            assert len(set(keys.tolist())) == n and int(keys.min()) >= 0 and int(keys.max()) <= row
            held = torch.zeros(tokens, dtype=torch.bool)
            held[keys.long()] = True
            assert not (support[bh, row].cpu() & ~held).any(), (bh, row)


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_agree_with_the_forward_over_all_keys(name):
    """The list forward's output and gradients equal those of the forward over all keys (``lists`` False) to
    rounding (near-tie rows aside)."""
    q, k, v = make(1, 2, 400, 32, torch.float32, seed=41, scale=0.9)
    slopes, row_scale = alibi(2, 1, 400, seed=8)
    z = dense_scores(q.double(), k.double(), 1.0 / math.sqrt(32), slopes.double(), row_scale.double())
    keep = ~tie_rows(name, z, q, k, None, slopes, row_scale)[..., None]
    results = []
    for tuning in (None, dict(lists=False)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, row_scale)]
        out = op_of(name, tuning)(*leaves[:3], row_scale=leaves[3], slopes=slopes)
        gen = torch.Generator(device=DEVICE).manual_seed(1)
        (out * torch.randn(out.shape, device=DEVICE, generator=gen) * keep).sum().backward()
        results.append([out.detach() * keep] + [t.grad for t in leaves])
    for label, a, b in zip(["out", "dq", "dk", "dv", "drow_scale"], *results, strict=True):
        err = rel_err(a, b)
        print(f"ERR lists vs all keys {name} {label} {err:.2e}")
        assert err <= 1e-4, (label, err)


def test_lists_fall_back_past_the_packed_bits(monkeypatch):
    """Key tiles that need more bits than ``_PACK_MAX`` take the forward over all keys (the same result)."""
    q, k, v = make(1, 1, 300, 32, torch.float32, seed=51)  # 5 key tiles: 3 bits
    assert entmax_lists._pack_bits(300, 64) == 3 and entmax_lists._lists_apply(q)
    want = entmax.entmax_attention(q, k, v)
    monkeypatch.setattr(entmax_lists, "_PACK_MAX", 2)
    assert not entmax_lists._lists_apply(q)
    assert rel_err(entmax.entmax_attention(q, k, v), want) <= 1e-5
    monkeypatch.setattr(entmax_lists, "_PACK_MAX", 12)
    assert not entmax_lists._lists_apply(q, dict(lists=False))


def test_pack_bits():
    assert entmax_lists._pack_bits(1, 64) == 1 and entmax_lists._pack_bits(128, 64) == 1
    assert entmax_lists._pack_bits(65_536, 64) == 10 and entmax_lists._pack_bits(70_000, 64) == 11
    assert entmax_lists._pack_bits(262_144, 64) == 12 and entmax_lists._pack_bits(262_145, 64) == 13
    # the compiled widths: four for every length the lists take, the same at 65,536 tokens
    assert [entmax_lists._pack_launch(b) for b in range(1, 14)] == [6] * 6 + [8] * 2 + [10] * 2 + [12] * 2 + [13]
    assert entmax_lists._pack_launch(entmax_lists._pack_bits(65_536, 64)) == 10


def test_sieve_lists_paths():
    """Sieve: most rows of N(0, 1) scores are listed; row 0 (no earlier key) is open: zeros by default (Eq. 7
    weighs earlier keys only), its own value with the remainder on the diagonal."""
    q, k, v = make(1, 2, 600, 32, torch.float32, seed=61)
    listed, total, ncand, _ = path_counts("sieve", q, k, v)
    assert listed >= 0.9 * total and not (ncand[:, 0] > 0).any(), (listed, total)
    torch.testing.assert_close(sieve.sieve_attention(q, k, v)[:, :, 0], torch.zeros_like(v[:, :, 0]))
    torch.testing.assert_close(sieve.sieve_attention(q, k, v, remainder="diagonal")[:, :, 0], v[:, :, 0])


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_lists_zero_queries(name):
    """Every third query zero: rows of exactly equal scores (packed zeros, a dead heat in every column), the
    short ones listed with every key a candidate, the others open; still the reference."""
    q, k, v = make(1, 2, 200, 32, torch.float32, seed=71)
    q[:, :, ::3] = 0
    listed, total, ncand, _ = path_counts(name, q, k, v)
    assert (ncand[:, 3:60:3] > 0).all() and not (ncand[:, 99::3] > 0).any()
    check(name, q, k, v, seed=71, label="zero queries")


def test_pack_keeps_zero_scores():
    """Every score exactly 0 (zero queries): the packed zeros are subnormal numbers (``_pack`` no longer raises
    them), and each row's list still holds each of its keys exactly once: the packed bits survive the merges
    and the comparisons."""
    q, k, v = make(1, 1, 60, 32, torch.float32, seed=81)
    q = torch.zeros_like(q)
    listed, total, ncand, lists = path_counts("entmax", q, k, v)
    assert listed == total
    for row in range(60):
        n = int(ncand[0, row])
        assert n == row + 1, (row, n)
        assert sorted(lists[0, row, :n].tolist()) == list(range(row + 1)), row


def threshold_rounding(q, k, sm_scale, row_scale, xs, terms, tau):
    """A bound, per row ``[B, H, T]``, on how far a threshold that a kernel computes in float32 from its float32
    scores ``X = XS (q.k sm_scale) rs`` may lie from the float64 one (``tau``) of the same inputs. ``tau`` is
    1-Lipschitz in the scores (sup norm), and each score, a dot product of D terms then two products, is off by at
    most ``gamma_(D+2) sum_i |q_i k_i| sm_scale |rs| XS`` (Higham, "Accuracy and Stability of Numerical
    Algorithms", Section 3.1: ``gamma_n = n u / (1 - n u)``, u = 2^-24) in any order of the sums; the root's sums
    over at most ``terms`` candidates, and its steps, add ``gamma_(2 terms + 6)`` of the larger of the row's
    scores, ``|tau|`` and 1. So ``u (D + 2 terms + 8) M`` with ``M`` the largest of those, to first order. At the
    narrow rows of ``test_sampled_start_of_wide_tiles`` (a query twenty times a key: sparsemax's ``X`` up to 18.5, where
    float32's spacing is 1.9e-6) it is about 5e-5; float32 sums of their D products in the orders a GPU takes
    (each thread's products in sequence by fused multiply-adds, then across threads) put the largest ``X`` of 7-10
    of those 64 rows above the float64 one by more than 1e-6, up to 1.9e-6."""
    tokens, dim = q.shape[-2], q.shape[-1]
    magnitude = q.double().abs() @ k.double().abs().transpose(-1, -2) * sm_scale * xs
    if row_scale is not None:
        magnitude = magnitude * row_scale.double().abs()[..., None]
    future = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).triu(1)
    largest = torch.maximum(magnitude.masked_fill(future, 0.0).amax(-1), tau.abs()).clamp_min(1.0)
    return 2.0 ** -24 * (dim + 2 * terms + 8) * largest


def exact_tau(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """The threshold of alpha-entmax (1.5 or 2) over the last axis of ``x`` (float64, ``-inf`` for the keys a row
    does not see) on the kernels' scale ``X = (alpha - 1) z``, by sorting."""
    s, _ = torch.sort(x, dim=-1, descending=True)
    finite = torch.isfinite(s)
    s = torch.where(finite, s, torch.zeros_like(s))
    k = torch.arange(1, s.shape[-1] + 1, dtype=s.dtype, device=s.device)
    c1 = torch.cumsum(s, -1)
    if alpha == 2.0:
        tau = (c1 - 1) / k
    else:
        c2 = torch.cumsum(s * s, -1)
        tau = (c1 - torch.sqrt(torch.clamp(c1 * c1 - k * (c2 - 1), min=0))) / k
    ok = finite & (tau < s)
    last = (ok * k).argmax(-1, keepdim=True)  # the largest support size whose root lies below its least score
    return tau.gather(-1, last).squeeze(-1)


@pytest.mark.parametrize("name", ["entmax", "sparsemax"])
@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0, 2.5])
def test_lean_newton_threshold(name, scale):
    """The Newton passes by their two sums alone (``lean``, the default) find the threshold as the passes with
    the exact root did (``lean`` False), and both the float64 threshold: on near-uniform rows (supports of
    hundreds of keys, several passes), on N(0, 1) rows and on peaked ones."""
    alpha = ALPHA[name]
    q, k, _ = make(1, 2, 700, 32, torch.float32, seed=91, scale=scale)
    z = dense_scores(q.double(), k.double(), 1.0 / math.sqrt(32), None, None)
    future = torch.ones(700, 700, dtype=torch.bool, device=z.device).triu(1)
    want = exact_tau(z.masked_fill(future, float("-inf")) * (alpha - 1), alpha)
    taus = {}
    for lean in (True, False):
        taus[lean] = entmax.entmax_threshold(q, k, alpha=alpha, tuning=dict(lean=lean)).double()
    for lean, tau in taus.items():
        err = (tau - want).abs().max().item()
        print(f"ERR lean={lean} {name} scale {scale}: |tau - tau*| {err:.2e}")
        assert err <= 2e-5 * (1 + want.abs().max().item()), (lean, err)
    assert (taus[True] - taus[False]).abs().max().item() <= 2e-5 * (1 + want.abs().max().item())


@pytest.mark.parametrize("with_bias", [False, True], ids=["fold", "slopes"])
def test_pair_merges_equal_single_inserts(with_bias):
    """The first stage merging two key tiles a step (``pairs``, the default) keeps exactly the values one tile
    a step keeps: the same lists, candidate counts and thresholds, bit for bit, with an odd key tile left before
    the diagonal in some query tiles (T 700: 11 key tiles of 64)."""
    q, k, v = make(1, 2, 700, 32, torch.float32, seed=95, scale=0.7)
    slopes, row_scale = alibi(2, 1, 700, seed=9) if with_bias else (None, None)
    got = []
    for pairs in (True, False):
        pb = Problem(q, k, v, slopes, row_scale, None)
        tau, ncand, keys, *_ = entmax_lists._lists_start(pb, 0.5, False, tuning=dict(pairs=pairs))
        listed = ncand > 0
        held = torch.where(torch.arange(keys.shape[-1], device=DEVICE) < ncand[..., None], keys, -1)
        threshold = entmax.entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, tuning=dict(pairs=pairs))
        got.append((tau, listed, ncand, torch.sort(held, -1).values, threshold))
    listed = int(got[0][1].sum())
    assert listed > 0 and (with_bias or listed < got[0][1].numel()), listed  # both paths (ALiBi lists every row)
    for a, b in zip(*got, strict=True):
        assert torch.equal(a, b)


@triton.jit
def _skip_kernel(Q, K, SL, RS, KMAX, LO, sm_scale, T, H, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                 XS: tl.constexpr, STEP: tl.constexpr):
    """``LO[bh, tile]``: the key where ``_alibi_skip`` starts each query tile's first stage."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base, offs_m, offs_d, row_ok, dmask, q, slope, rs, diag, hi = search._query_tile(
        Q, SL, RS, T, H, pid_m, bh, False, True, True, D, BD, BM)
    lo = entmax_lists._alibi_skip(q, K, KMAX, base, offs_m, offs_d, row_ok, row_ok[:, None] & dmask[None, :], bh, diag,
                            sm_scale, slope, rs, D, XS, STEP)
    tl.store(LO + bh * tl.num_programs(0) + pid_m, lo)


@pytest.mark.parametrize("xs", [0.5, 1.0], ids=["entmax", "sparsemax"])
def test_alibi_skip_leaves_out_only_keys_far_below_the_row_maximum(xs):
    """``_alibi_skip`` (the first stage of ALiBi heads starts past the keys that cannot reach within 1 of the row
    maximum; here one key a step, the kernel's 128): its bound, computed again in float64, to one key; every key
    it skips lies more than 1 below its row's own score ``X_rr`` in every row of the tile (so below ``X_max - 1
    <= tau*``), in the float64 scores; steep heads skip most keys, a head without a slope and a tile with a row
    of negative scale skip none."""
    heads, tokens, bm = 3, 1000, 64
    q, k, v = make(1, heads, tokens, 32, torch.float32, seed=61, scale=1.5)
    slopes = torch.tensor([0.5, 0.05, 0.0], device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    row_scale = 0.5 + torch.rand(1, heads, tokens, device=DEVICE, generator=gen)
    row_scale[0, 0, 520:530] = -0.5  # query tile 8 of head 0: no skip
    sm_scale = 1.0 / math.sqrt(32)
    tiles = triton.cdiv(tokens, bm)
    lo = torch.zeros(heads, tiles, dtype=torch.int32, device=DEVICE)
    kmax = k.float().norm(dim=-1).amax(-1).reshape(-1)
    _skip_kernel[(tiles, heads)](q, k, slopes, row_scale, kmax, lo, sm_scale, tokens, heads, D=32, BD=32, BM=bm,
                                 XS=xs, STEP=1)
    # the bound in float64
    qd, kd, scale = q[0].double(), k[0].double(), xs * row_scale[0].double()
    own = scale * (qd * kd).sum(-1) * sm_scale
    reach = qd.norm(dim=-1) * kd.norm(dim=-1).amax(-1, keepdim=True) * sm_scale
    bound = own - 1 - 2.0 ** -8 * (own.abs() + 1)
    last = torch.arange(tokens, device=DEVICE) - (reach - bound / scale) / slopes.double()[:, None]
    last = torch.where(scale > 0, last, -1.0)
    x = xs * dense_scores(q.double(), k.double(), sm_scale, slopes.double(), row_scale.double())[0]
    for h in range(heads):
        for t in range(tiles):
            rows = slice(t * bm, min(tokens, (t + 1) * bm))
            start = int(lo[h, t])
            want = 0 if slopes[h] == 0 else int(last[h, rows].min().clamp(0, t * bm).floor())
            assert abs(start - want) <= 1, (h, t, start, want)
            if start:
                assert (x[h, rows, :start] < own[h, rows, None] - 1).all(), (h, t, start)
    assert (lo[2] == 0).all() and lo[0, 8] == 0
    steep = torch.arange(tiles, device=DEVICE) != 8
    assert (lo[0, steep] >= torch.arange(tiles, device=DEVICE)[steep] * bm - 200).all(), lo[0]
    assert 0 < int((lo[1] > 0).sum()) < tiles, lo[1]


@pytest.mark.parametrize("name", ["entmax", "sparsemax"])
def test_alibi_skip_matches_reference(name):
    """With ``alibi_skip`` the list forward of ALiBi heads (steep, shallow and none; a negative row scale in
    some rows) agrees with the float64 reference and with the forward that looks at every key."""
    q, k, v = make(1, 3, 700, 32, torch.float32, seed=71, scale=1.2)
    slopes = torch.tensor([0.5, 0.02, 0.0], device=DEVICE)
    _, row_scale = alibi(3, 1, 700, seed=5)
    row_scale[0, 0, 300:310] = -0.5
    outs = []
    for skip in (True, False):
        if skip:
            check(name, q, k, v, slopes=slopes, row_scale=row_scale, label="alibi_skip", tuning=dict(alibi_skip=True))
        outs.append(op_of(name, dict(alibi_skip=skip))(q, k, v, slopes=slopes, row_scale=row_scale))
    assert rel_err(outs[0], outs[1]) <= 1e-5


def test_tuning_replaces_defaults_and_unknown_keys_fail():
    """``tuning`` replaces some launch settings and keeps the others; an unknown key is one line naming it."""
    assert launch_config(32)["alibi_skip"] is True
    config = launch_config(32, dict(alibi_skip=False, list_size=32))
    assert config["alibi_skip"] is False and config["list_size"] == 32 and config["rescue"] is True
    with pytest.raises(ValueError, match="unknown keys") as error:
        launch_config(32, {"alibi_skp": True})
    assert "alibi_skp" in str(error.value) and "\n" not in str(error.value)


RESCUE_CASES = ["random", "wide", "alibi", "overflow"]


@pytest.mark.parametrize("case", RESCUE_CASES)
@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_rescue_lists_more_rows_and_matches_reference(name, case):
    """``rescue`` (``_rescue_kernel``): rows not certified, with at most ``max_sat`` saturated columns, are
    finished from lists that the scan of those columns completes. The output and gradients stay the float64
    reference's; rows are listed that were open without it (``random``, ``wide``: N(0, 1) scores at 600 keys,
    and times 0.8; ``alibi``: slopes and row scales), and none is listed that was open with ``max_sat`` 0 or
    with lists too short for its candidates (``overflow``: 8 slots; such rows stay open)."""
    scale = {"random": 1.0, "wide": 0.8, "alibi": 0.9, "overflow": 0.8}[case]
    q, k, v = make(1, 2, 600, 32, torch.float32, seed=3 + len(case), scale=scale)
    extra = {}
    if case == "alibi":
        slopes, row_scale = alibi(2, 1, 600, seed=6)
        extra = dict(slopes=slopes * 0.05, row_scale=row_scale)
    size = 8 if case == "overflow" else 64
    before, total, ncand_before, _ = path_counts(name, q, k, v, **extra, tuning=dict(rescue=False, list_size=size))
    assert torch.equal(path_counts(name, q, k, v, **extra, tuning=dict(rescue=True, max_sat=0, list_size=size))[2],
                       ncand_before)
    rescue = dict(rescue=True, list_size=size)
    after, _, ncand_after, keys_after = path_counts(name, q, k, v, **extra, tuning=rescue)
    # the rows listed before keep their lists' lengths; no row is left pending (NCAND < 0)
    assert torch.equal(ncand_after[ncand_before > 0], ncand_before[ncand_before > 0])
    assert int((ncand_after < 0).sum()) == 0 and int(ncand_after.max()) <= size
    if case == "overflow":
        assert after >= before, (before, after, total)
    elif name != "sparsemax":  # sparsemax's supports are narrower: few rows are open at these scales
        assert after > before, (before, after, total)
    if keys_after is not None:  # the rescued lists name distinct keys each row sees
        rescued = (ncand_after > 0) & (ncand_before == 0)
        for bh, row in rescued.nonzero().tolist():
            keys = keys_after[bh, row, : ncand_after[bh, row]]
            assert int(keys.min()) >= 0 and int(keys.max()) <= row and keys.unique().numel() == keys.numel()
    check(name, q, k, v, label=f"rescue {case}", **extra, tuning=rescue)


@pytest.mark.parametrize("case", ["random", "alibi", "wide"])
def test_sieve_scan_matches_the_pairwise_sums(case):
    """``sieve_scan``: Sieve's listed rows with their candidates sorted by key in registers and
    the stick's suffix sums a cumulative sum. The same rows are listed, the output is the pairwise sums'
    (to fp32 rounding: the sums run in another order) and the float64 reference's, and so are the gradients
    (the backward reads the supports this forward kept, now in descending key order)."""
    scale = {"random": 1.0, "alibi": 0.9, "wide": 0.7}[case]
    q, k, v = make(1, 2, 300, 32, torch.float32, seed=21 + len(case), scale=scale)
    extra = {}
    if case == "alibi":
        slopes, row_scale = alibi(2, 1, 300, seed=7)
        extra = dict(slopes=slopes * 0.05, row_scale=row_scale)
    results = {}
    for scan in (False, True):
        listed, total, ncand, _ = path_counts("sieve", q, k, v, **extra, tuning=dict(sieve_scan=scan))
        results[scan] = listed, ncand, sieve.sieve_attention(q, k, v, **extra, tuning=dict(sieve_scan=scan))
    assert 0 < results[True][0] < total or case == "random", (results[True][0], total)
    assert results[True][0] > 0 and torch.equal(results[True][1], results[False][1])
    torch.testing.assert_close(results[True][2], results[False][2], atol=2e-6, rtol=2e-5)
    check("sieve", q, k, v, label=f"sieve scan {case}", **extra)


def test_row_cumsum_matches_torch():
    """``_row_cumsum`` (the open rows' slots, chunked) equals ``torch.cumsum`` as int32, at lengths around its
    chunks and with no, few, half and all rows flagged."""
    gen = torch.Generator(device=DEVICE).manual_seed(9)
    chunk = open_rows._SCAN_CHUNK
    for heads, tokens in [(1, 1), (3, 4 * chunk), (3, 4 * chunk + 1), (2, 17 * chunk - 5), (16, 8192)]:
        for share in (0.0, 0.01, 0.5, 1.0):
            flags = torch.rand(heads, tokens, device=DEVICE, generator=gen) < share
            got = open_rows._row_cumsum(flags)
            assert got.dtype == torch.int32 and torch.equal(got, torch.cumsum(flags, 1, dtype=torch.int32))
    done = (torch.rand(2, 3000, device=DEVICE, generator=gen) < 0.9).to(torch.int8)
    rows, count = open_rows._open_rows(done)
    for bh in range(2):
        want = (done[bh] == 0).nonzero().flatten()
        assert int(count[bh]) == want.numel() and torch.equal(rows[bh, : want.numel()].long(), want)


def test_bad_open_tiles_fail_before_any_launch(monkeypatch):
    """An open-row tile setting whose rows are not a multiple of its keys, or a ``few_open`` that is not a pair,
    is refused with one line before the first stage runs."""
    q, k, v = make(1, 1, 64, 32, torch.float32, seed=1)
    launched = []

    class Spy:  # stands for the first stage's kernel: records a launch
        def __getitem__(self, grid):
            launched.append(grid)
            return lambda *args, **kwargs: None

    monkeypatch.setattr(entmax_lists, "_lists_start_kernel", Spy())
    for bad in (dict(newton_few=(16, 32, 2, 3)), dict(sieve_open_few=(24, 16, 2, 3)), dict(sieve_open=(16, 32, 2, 3)),
                dict(few_open=(256,))):
        for name in ("entmax", "sieve"):
            with pytest.raises(ValueError, match="bad launch settings") as error:
                op_of(name, bad)(q, k, v)
            assert "\n" not in str(error.value)
    assert not launched


@pytest.mark.skipif(not CUDA, reason="the open rows' count is read on CUDA only")
@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_few_open_rows_take_their_tiles(name, monkeypatch):
    """``few_open``: where the open rows are few, the Newton kernel and Sieve's open walk take the
    ``*_few`` tiles; the output and gradients stay the reference's and the forward equals the usual tiles'
    (the same rows, walked in other tiles). Wide scores leave many rows open; ``few_open`` ``(0, 0)`` counts
    them as many, a huge limit as few, and below its token floor the count is never read."""
    # lists of 8 slots: sparsemax's supports are narrower, and at 0.6 all its rows fit 64 (on the H100)
    q, k, v = make(1, 2, 700, 32, torch.float32, seed=44, scale=0.6)
    listed, total, *_ = path_counts(name, q, k, v, tuning=dict(list_size=8))
    assert listed < total, (listed, total)
    verdicts = []
    real = open_rows._OpenCount.few
    monkeypatch.setattr(open_rows._OpenCount, "few", lambda self: verdicts.append(real(self)) or verdicts[-1])
    tiles = dict(newton_few=(16, 16, 2, 3), sieve_open_few=(16, 16, 2, 3), list_size=8)
    outs = {}
    for label, few_open in (("many", (0, 0)), ("few", (1 << 30, 0)), ("short", (1 << 30, 701))):
        verdicts.clear()
        outs[label] = op_of(name, dict(few_open=few_open, **tiles))(q, k, v)
        # one verdict a launch that asks (the Newton kernel; and Sieve's open walk), the count read once
        want = {"many": False, "few": True, "short": False}[label]
        assert verdicts == [want] * (2 if name == "sieve" else 1), (label, verdicts)
    torch.testing.assert_close(outs["few"], outs["many"], atol=2e-6, rtol=2e-5)
    assert torch.equal(outs["short"], outs["many"])
    check(name, q, k, v, seed=44, label="few open rows", tuning=dict(few_open=(1 << 30, 0), **tiles))


@pytest.mark.skipif(not CUDA, reason="the open rows' count is read on CUDA only")
def test_sieve_few_open_rows_by_default():
    """With the defaults, at ``few_open``'s token floor (16,384), N(0, 1) scores leave about 1% of the rows
    open: few, so Sieve's open walk takes ``sieve_open_few``'s tiles, and neither it nor the Newton kernel runs
    in phases; output and gradients are the float64 reference's."""
    tokens = launch_config(32)["few_open"][1]
    q, k, v = make(1, 1, tokens, 32, torch.bfloat16, seed=16)
    verdicts = []
    real = open_rows._OpenCount.few
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(open_rows._OpenCount, "few", lambda self: verdicts.append(real(self)) or verdicts[-1])
        check("sieve", q, k, v, seed=16, label=f"few open rows by default, T {tokens}")
    # one verdict a launch that asks: the Newton kernel (newton_phases), the open walk
    assert verdicts == [True, True], verdicts


def count_open_rows(monkeypatch) -> list[int]:
    """A list that every gathering of open rows (``_open_rows``, in every module that calls it) appends its
    total count to, in order."""
    counts = []
    real = open_rows._open_rows

    def spy(done):
        rows, count = real(done)
        counts.append(int(count.sum()))
        return rows, count

    for module in (search, entmax_lists, sieve):
        monkeypatch.setattr(module, "_open_rows", spy)
    return counts


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_phases_regather_the_open_rows(name, monkeypatch):
    """``newton_phases`` and ``sieve_phases``: the Newton passes and Sieve's open walk in phases,
    the open rows still going gathered again after each. Wide scores and lists of 8 slots leave many rows
    open; after the first phase some are done and some go on (so both paths run); the output equals one
    launch's (up to the Newton tolerance and the ``e^-60`` of the stick left at an early exit) and the output
    and gradients the float64 reference's."""
    q, k, v = make(1, 2, 700, 32, torch.float32, seed=45, scale=0.6)
    # Newton's steps alone (no bracket): with it, every open row here ends within the first phase's two passes
    base = dict(list_size=8, few_open=None, bracket=False)
    listed, total, *_ = path_counts(name, q, k, v, tuning=base)
    assert listed < total, (listed, total)
    single = op_of(name, base)(q, k, v)
    counts = count_open_rows(monkeypatch)
    phases = dict(base, phases_from=0, newton_phases=(2, 1), sieve_phases=(64, 128))
    phased = op_of(name, phases)(q, k, v)
    # _lists_start: the rescue's rows, the open rows, the Newton phases' rows; Sieve: its walk's phases'
    n_open = counts[1]
    newton = counts[2:4]
    assert 0 < newton[0] < n_open and newton[1] <= newton[0], counts
    if name == "sieve":
        walk = counts[4:6]
        assert len(counts) == 6 and 0 < walk[0] < n_open and walk[1] <= walk[0], counts
    else:
        assert len(counts) == 4, counts
    torch.testing.assert_close(phased, single, atol=2e-6, rtol=2e-5)
    check(name, q, k, v, seed=45, label="phases", tuning=phases)
    # below ``phases_from`` tokens: one launch each
    counts.clear()
    assert torch.equal(op_of(name, dict(phases, phases_from=701))(q, k, v), single) and len(counts) == 2, counts


def test_bad_phases_fail_before_any_launch():
    q, k, v = make(1, 1, 64, 32, torch.float32, seed=0)
    for bad in (dict(newton_phases=(0,)), dict(sieve_phases=(64, -1))):
        with pytest.raises(ValueError, match="bad launch settings"):
            sieve.sieve_attention(q, k, v, tuning=bad)




@pytest.mark.parametrize("subset, left", [(4, 0.0), (2, 0.35)])
def test_newton_bracket_ends_rows_early(subset, left, monkeypatch):
    """A lean Newton pass ends a row once its bracket (``_bracket``) is narrower than ``tol``: one pass before
    Newton's step alone would show the row converged. On near-uniform rows (supports of hundreds of keys, 888
    rows open after the default first stage), every open row has ended after the first phase of two passes;
    from a weaker start (the top 2 of each column) at most ``left`` of them go on. By Newton's step alone
    (``bracket`` False) over three quarters of them go on. The thresholds are the float64 ones within ``tol``."""
    q, k, _ = make(1, 2, 700, 32, torch.float32, seed=91, scale=0.3)
    z = dense_scores(q.double(), k.double(), 1.0 / math.sqrt(32), None, None)
    future = torch.ones(700, 700, dtype=torch.bool, device=z.device).triu(1)
    want = exact_tau(z.masked_fill(future, float("-inf")) * 0.5, 1.5)
    counts = count_open_rows(monkeypatch)
    bound = 2e-6 * (1 + want.abs().max().item())
    for bracket in (True, False):
        counts.clear()
        tuning = dict(subset=subset, newton_phases=(2,), phases_from=0, bracket=bracket)
        err = (entmax.entmax_threshold(q, k, tuning=tuning).double() - want).abs().max().item()
        print(f"ERR subset {subset} bracket {bracket}: open rows {counts}, |tau - tau*| {err:.2e}")
        # the rows the first stage left open, then those still going after two passes
        assert len(counts) == 2 and counts[0] > 800, counts
        if bracket:
            assert counts[1] <= left * counts[0], counts
        else:
            assert counts[1] > 0.75 * counts[0], counts
        assert err <= bound


@pytest.mark.parametrize("with_rs", [False, True], ids=["plain", "row-scale"])
@pytest.mark.parametrize("name", ["entmax", "sparsemax"])
def test_sampled_start_of_wide_tiles(name, with_rs):
    """``sample``: a query tile whose rows are (three quarters at least) wide starts its Newton passes from an
    estimate over every ``stride``-th key instead of the first stage's lower bound; a tile with half of its rows
    narrow takes the first stage. With no Newton pass (``max_iter`` 0) the starts show which: the sampled ones
    lie on either side of ``tau*``, within 0.1 of it, and below the row's largest ``X``; the first stage's, on
    the rows it leaves open, below ``tau*`` (``tau_sub - 2 eps``), and on the rows it lists the threshold their
    lists finish with, ``tau*`` within the float32 rounding of their scores (``threshold_rounding``). With the
    passes, the output and gradients are the float64 reference's; also with a row scale (ASEntmax's scores)."""
    scale, size = (0.3, 16) if name == "entmax" else (0.3, 4)  # sparsemax's supports are narrower
    q, k, v = make(1, 2, 700, 32, torch.float32, seed=93, scale=scale)
    q[:, :, 576:608] = k[:, :, 575:607] * 20.0  # narrow rows (one key far above the others): half of tile 9
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    row_scale = 0.8 + 0.4 * torch.rand(1, 2, 700, device=DEVICE, generator=gen) if with_rs else None
    xs = ALPHA[name] - 1.0
    z = dense_scores(q.double(), k.double(), 1.0 / math.sqrt(32), None,
                     None if row_scale is None else row_scale.double())
    future = torch.ones(700, 700, dtype=torch.bool, device=z.device).triu(1)
    x = z.masked_fill(future, float("-inf")) * xs
    want = exact_tau(x, ALPHA[name])[0]
    tuning = dict(sample=(2, 64, 0), list_size=size)  # first every 8th key, then every 2nd
    pb = Problem(q, k, v, None, row_scale, None)
    starts = {}
    for label, setting in (("sampled", tuning), ("first stage", dict(tuning, sample=None))):
        _, tau, _, _, _, ncand, _ = entmax._lists_forward(pb, ALPHA[name], False, max_iter=0, tuning=setting)
        starts[label] = tau[0].double()
    listed = ncand > 0  # [H, T] (one sequence): the rows the first stage lists are finished from their lists
    bound = threshold_rounding(q, k, 1.0 / math.sqrt(32), row_scale, xs, size, want)[0]
    first = starts["first stage"] - want
    print(f"ERR first stage: {int(listed.sum())} rows listed, largest |tau - tau*| / bound there "
          f"{(first.abs() / bound)[listed].max().item():.3f}; open rows' largest start - tau* "
          f"{first[~listed].max().item():.2e}")
    assert 0 < int(listed.sum()) < listed.numel()
    assert (first[~listed] < 0).all() and (first.abs() <= bound)[listed].all()
    above = starts["sampled"] > want + 1e-6
    # tiles from 2 (128 keys below them, 64 sampled) but tile 9: some starts above tau*, all close to it
    tiles = torch.arange(700, device=z.device) // 64
    sampled = (tiles >= 2) & (tiles != 9)
    per_tile = [int(above[:, tiles == t].sum()) for t in range(11)]
    print(f"ERR sampled starts above tau* per tile {per_tile}")
    assert all(per_tile[t] > 0 for t in range(2, 11) if t != 9)
    # tile 9 (half its rows narrow) and the first two (too few keys to sample) take the first stage: its starts,
    # which on listed rows may lie above tau* by their float32 rounding (checked above), not by a sample's error
    first_stage = ~sampled
    assert torch.equal(starts["sampled"][:, first_stage], starts["first stage"][:, first_stage])
    gap = (starts["sampled"] - want).abs()[:, sampled]
    print(f"ERR sampled starts: largest |start - tau*| {gap.max().item():.3g}")
    assert gap.max().item() < 0.1
    assert (starts["sampled"][:, sampled] < x.max(-1).values[0][:, sampled]).all()
    check(name, q, k, v, row_scale=row_scale, seed=93, label="sampled start", tuning=tuning)


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "sieve"])
def test_fold_with_a_row_scale(name):
    """``fold`` with a row scale and no slopes (ASEntmax's scores): the search's and entmax's open rows' output
    pass take ``X`` in one product a score, ``q.k (sm_scale rs XS)``, instead of ``((q.k sm_scale) rs) XS``.
    The two differ by a rounding: the same rows are listed, the outputs agree within 1e-5, and the folded forward
    is the float64 reference's (output and gradients), rows with a negative or zero scale included."""
    q, k, v = make(1, 2, 300, 32, torch.float32, seed=41, scale=0.6)
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    row_scale = 0.5 + torch.rand(1, 2, 300, device=DEVICE, generator=gen)
    row_scale[0, 0, 200:210] = -0.7
    row_scale[0, 1, 250:253] = 0.0
    listed = {fold: path_counts(name, q, k, v, row_scale=row_scale, tuning=dict(fold=fold)) for fold in (True, False)}
    print(f"ERR fold: listed {listed[True][0]} of {listed[True][1]} rows (unfolded {listed[False][0]})")
    assert torch.equal(listed[True][2] > 0, listed[False][2] > 0)
    assert 0 < listed[True][0] < listed[True][1]  # both the lists and the open rows' passes
    outs = [op_of(name, dict(fold=fold))(q, k, v, row_scale=row_scale) for fold in (True, False)]
    assert rel_err(outs[0], outs[1]) <= 1e-5
    check(name, q, k, v, row_scale=row_scale, seed=41, label="fold with a row scale")
