"""Fidelity to the papers' authors' public code where the papers are silent (docs/conventions.md).

Each fact is recomputed here from a small re-implementation of the authors' convention (written from their
files' behaviour, not copied): deep-spin/asentmax ``scripts/generate_data.py`` and
``synthetic/src/models/architectures/sparse_gemma.py`` ("Long-Context Generalization with Sparse Attention"),
snap-research/TDA ``triton_threshold_attention.py`` ("Threshold Differential Attention"). The kernel tests at the
end run the Triton kernels on a GPU or, on the CPU, under the Triton interpreter (``TRITON_INTERPRET=1`` set
before Triton is imported, fp32, short rows); they are skipped otherwise.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from lengthbench import attention_weights
from lengthbench.models.attention import ATTENTION
from lengthbench.tasks import IGNORE_INDEX, get_task

# -- MQMTAR ------------------------------------------------------------------------------------------------------

AUTHORS_PREFIX = {64: 64, 128: 119, 256: 238, 512: 476, 1024: 952, 2048: 1911, 4096: 3822, 8192: 7644,
                  16384: 15288, 32768: 30583, 65536: 61166}


def authors_num_kv(n: int) -> int:
    """The authors' pair count: the share 0.8 of the length over the pair's 2 + 2 + 2 tokens, floored."""
    return int(n * 0.8 // 6)


def authors_block(n: int, rng: np.random.Generator) -> list[str]:
    """One block of the authors' MQMTAR prefix: a row of ``2 (n // num_kv + 1)`` slots with the pair
    ``k k <kv> v v <space>`` centred in it, then all but ``n // num_kv`` slots deleted at random among the
    others."""
    block = n // authors_num_kv(n)
    row_len = 2 * (block + 1)
    row = ["<space>"] * row_len
    start = row_len // 2 - 5 // 2
    row[start : start + 6] = ["k", "k", "<kv>", "v", "v", "<space>"]
    others = [i for i in range(row_len) if not start <= i < start + 6]
    dropped = set(rng.permutation(others)[: row_len - block].tolist())
    return [s for i, s in enumerate(row) if i not in dropped]


def spaces_before_pairs(prefix: list[str]) -> list[int]:
    """Per block, the ``<space>`` tokens before its pair's first key token."""
    return [i - 2 for i, s in enumerate(prefix) if s == "<kv>"]


@pytest.mark.parametrize("n", sorted(AUTHORS_PREFIX))
def test_mqmtar_prefix_length_is_the_authors(n):
    task = get_task("mqmtar")
    assert task.num_pairs(n) == authors_num_kv(n)
    assert task.prefix_tokens(n) == authors_num_kv(n) * (n // authors_num_kv(n)) == AUTHORS_PREFIX[n]
    assert task.max_tokens(n) == 1 + AUTHORS_PREFIX[n] + 4 * 3 + 1 + 4 * 3 + 1


@pytest.mark.parametrize("n,extra", [(64, 2), (1024, 1), (4096, 1)])
def test_mqmtar_blocks_and_spaces(n, extra):
    """Every block holds one whole pair and ``n // num_kv - 5`` spaces (its trailing one included)."""
    task = get_task("mqmtar")
    pairs, block = task.num_pairs(n), n // task.num_pairs(n)
    assert block - 6 == extra
    batch = task.batch(range(4), n, "test")
    space, kv = task.ids("<space>", "<kv>")
    prefix = batch.input_ids[:, 1 : 1 + pairs * block].reshape(4, pairs, block)
    assert ((prefix == kv).sum(-1) == 1).all()
    assert ((prefix == space).sum(-1) == block - 5).all()
    assert (batch.realised_tokens == task.max_tokens(n)).all()


def test_mqmtar_spaces_before_a_pair_follow_the_authors_distribution():
    """The number of spaces before each pair: ours against the authors' row-and-delete construction."""
    rng = np.random.default_rng(0)
    for n in (64, 1024):
        theirs = [spaces_before_pairs(authors_block(n, rng))[0] for _ in range(4000)]
        task = get_task("mqmtar")
        pairs, block = task.num_pairs(n), n // task.num_pairs(n)
        ids = task.batch(range(4000 // pairs + 1), n, "test").input_ids[:, 1 : 1 + pairs * block]
        rows = [[task.vocab[i] for i in row] for row in ids.reshape(-1, block)]
        ours = [spaces_before_pairs(r)[0] for r in rows]
        for a in range(block - 6 + 1):
            p_theirs, p_ours = np.mean(np.equal(theirs, a)), np.mean(np.equal(ours, a))
            assert abs(p_theirs - p_ours) < 0.04, (n, a, p_theirs, p_ours)
        # the exact law: `extra` of `2 block + 2 - 6` free slots kept, `block - 1` of them before the pair
        free, before, extra = 2 * block - 4, block - 1, block - 6
        p_none = math.comb(free - before, extra) / math.comb(free, extra)
        assert abs(np.mean(np.equal(ours, 0)) - p_none) < 0.03


@pytest.mark.parametrize("n", [1024, 4096])
def test_mqmtar_keys_and_values_distinct(n):
    """Distinct within a sample, as the authors' draws without replacement; uniform values repeat."""
    def repeated_value_rate(task):
        pairs = task.num_pairs(n)
        ids = task.batch(range(32), n, "test").input_ids[:, 1 : 1 + task.prefix_tokens(n)]
        kv = task.token_id("<kv>")
        rates = []
        for row in ids:
            at = np.flatnonzero(row == kv)
            assert len(at) == pairs
            keys = {tuple(row[i - 2 : i]) for i in at}
            values = {tuple(row[i + 1 : i + 3]) for i in at}
            assert len(keys) == pairs
            rates.append(len(values) < pairs)
        return np.mean(rates)

    assert repeated_value_rate(get_task("mqmtar")) == 0.0
    assert repeated_value_rate(get_task("mqmtar", spacing="random", values="uniform")) > 0.05


def test_mqmtar_bad_spacing_or_values():
    with pytest.raises(ValueError, match="spacing must be one of"):
        get_task("mqmtar", spacing="even")
    with pytest.raises(ValueError, match="values must be one of"):
        get_task("mqmtar", values="any")


# -- Local Count --------------------------------------------------------------------------------------------------

def authors_localcount_lengths(n: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Source lengths of the authors' Local Count: ``int(n // ((48 + 2) / 2))`` runs of U[2, 48] tokens."""
    runs = int(n // ((48 + 2) / 2))
    return rng.integers(2, 49, size=(samples, runs)).sum(axis=1)


def test_localcount_whole_runs_and_realised_lengths():
    task = get_task("localcount")
    batch = task.batch(range(4000), 128, "test")
    ours = batch.realised_tokens - 2
    theirs = authors_localcount_lengths(128, 4000, np.random.default_rng(0))
    assert task.num_runs(128) == 5 and task.max_tokens(128) == 5 * 48 + 2
    assert abs(ours.mean() - 125) < 1.5 and abs(ours.mean() - theirs.mean()) < 2.0
    assert abs(ours.std() - theirs.std()) < 1.5  # sqrt(5 * (47^2 - 1) / 12) = 30.3
    assert 10 <= ours.min() and ours.max() <= 240 and ours.min() < 60 and ours.max() > 190
    last_run = []
    for b in range(200):
        row = np.array(batch.sample(b)["input_ids"][1:-1])
        starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        lengths = np.diff(np.r_[starts, len(row)])
        assert len(lengths) == 5 and (lengths >= 2).all() and (lengths <= 48).all()
        last_run.append(lengths[-1])
    assert min(last_run) >= 2  # no cut run


def test_localcount_cut_is_exactly_n():
    batch = get_task("localcount", runs="cut").batch(range(400), 128, "test")
    assert (batch.realised_tokens == 130).all()
    with pytest.raises(ValueError, match="runs must be one of"):
        get_task("localcount", runs="some")


# -- Flip-Flop ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["flipflop-sparse", "flipflop-dense"])
def test_flipflop_answer_at_the_final_read(name):
    """The authors' source ends at the final ``r``; its one target bit follows it. No ``<sep>``."""
    for n in (64, 65):
        task = get_task(name)
        batch = task.batch(range(8), n, "test")
        assert batch.input_ids.shape[1] == 2 * (n // 2) + 2 == task.max_tokens(n)
        read, sep = task.ids("r", "<sep>")
        assert (batch.input_ids[:, -3] == read).all() and not (batch.input_ids == sep).any()
        scored = np.argwhere(batch.labels != IGNORE_INDEX)
        assert sorted({int(t) for _, t in scored}) == [2 * (n // 2) - 1, 2 * (n // 2)]
        with_sep = get_task(name, sep=True).batch(range(8), n, "test")
        assert with_sep.input_ids.shape[1] == 2 * (n // 2) + 3
        # the same draws, written with <sep>: the instructions and the answer agree
        np.testing.assert_array_equal(with_sep.input_ids[:, : 2 * (n // 2)], batch.input_ids[:, : 2 * (n // 2)])
        np.testing.assert_array_equal(with_sep.input_ids[:, -2], batch.input_ids[:, -2])


def test_mqrar_model_has_four_layers():
    defaults = get_task("mqrar").model_defaults
    assert (defaults.layers, defaults.d_model, defaults.heads) == (4, 256, 16)


# -- TRA / TDA: the row index of the threshold -------------------------------------------------------------------

def authors_tau(tokens: int, head_dim: int, beta: float) -> torch.Tensor:
    """The authors' kernel: ``tau(i) = beta * sqrt(2 * log(i + 1) / d)`` for the 0-based row ``i``."""
    rows = torch.arange(tokens, dtype=torch.float64)
    return beta * torch.sqrt(2 * torch.log(rows + 1) / head_dim)


def cosine_scores(tokens, head_dim, seed, batch=1, heads=2, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, heads, tokens, head_dim, generator=gen), dim=-1)
            for _ in range(2))
    return (q @ k.transpose(-1, -2)).to(dtype)


def test_tra_threshold_matches_the_authors_kernel_and_eq1():
    from lengthbench.kernels.tra import tra_threshold as kernel_threshold
    from lengthbench.models.attention.threshold import tra_threshold

    tokens, head_dim, beta = 300, 32, 0.8
    counts = torch.arange(1, tokens + 1, dtype=torch.float64)[:, None]
    theirs = authors_tau(tokens, head_dim, beta)
    assert torch.equal(tra_threshold(counts, head_dim, beta)[:, 0], theirs)
    eq1 = beta * torch.sqrt(2 * torch.log(counts[:, 0] + 1) / head_dim)
    assert torch.equal(tra_threshold(counts, head_dim, beta, tau_index="eq1")[:, 0], eq1)
    for index in ("alg1", "eq1"):
        torch.testing.assert_close(kernel_threshold(tokens, head_dim, beta, 1.0, "cpu", index).double(),
                                   tra_threshold(counts, head_dim, beta, tau_index=index)[:, 0])
    with pytest.raises(ValueError, match="tau_index must be one of"):
        tra_threshold(counts, head_dim, beta, tau_index="eq2")


def test_tau_base_is_kept_per_shape_and_never_a_fake_tensor(monkeypatch):
    """``tau_base`` (the threshold per unit of beta) is made once per shape and handed out again, at most
    ``MAX_BASES`` of them kept; made under fake tensors it is not kept (a later real call would get a fake)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthbench.kernels.tra import op as tra

    monkeypatch.setattr(tra, "_BASES", {})
    first = tra.tau_base(300, 32, 1.0, "cpu", "alg1")
    assert tra.tau_base(300, 32, 1.0, "cpu", "alg1") is first
    assert tra.tau_base(300, 32, 1.0, "cpu", "eq1") is not first
    torch.testing.assert_close(first.double(), authors_tau(300, 32, 1.0))
    with FakeTensorMode():
        tra.tau_base(17, 16, 1.0, "cpu", "alg1")
    assert (17, 16, 1.0, 0.0, "cpu") not in tra._BASES
    assert not isinstance(tra.tau_base(17, 16, 1.0, "cpu", "alg1"), torch._subclasses.FakeTensor)
    for tokens in range(1, 2 * tra.MAX_BASES):
        tra.tau_base(tokens, 16, 1.0, "cpu", "alg1")
    assert len(tra._BASES) == tra.MAX_BASES and (1, 16, 1.0, 0.0, "cpu") not in tra._BASES


def test_tra_weights_equal_the_authors_convention():
    """Weights by the authors' tau equal ours exactly; Eq. 1's are lower, by up to 0.5 in the first rows (a key
    equal to its query, score 1, at head dim 16: ``1 - (1 - sqrt(2 log 2 / 16)) ** 2 = 0.50`` in row 0)."""
    tokens, head_dim = 64, 16
    z = cosine_scores(tokens, head_dim, seed=3)
    z.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # each query's own key
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    theirs = torch.where(causal, torch.relu(z - authors_tau(tokens, head_dim, 1.0)[:, None]) ** 2, 0.0)
    ours = attention_weights("tra", z, head_dim=head_dim)
    assert (ours - theirs).abs().max().item() == 0.0
    eq1 = attention_weights("tra", z, head_dim=head_dim, tau_index="eq1")
    assert (ours >= eq1).all()
    gap = (ours - eq1).amax(dim=(0, 1, 3))
    assert gap[0].item() == pytest.approx(1 - (1 - math.sqrt(2 * math.log(2) / 16)) ** 2) and gap[0] > 0.49
    assert (gap[1:] <= gap[:-1]).all() and gap[-1] < 0.05


@pytest.mark.parametrize("name", ["tra", "tda"])
def test_threshold_modules_default_to_algorithm_1(name):
    from lengthbench.models.positional import POSITIONAL_ENCODINGS

    pe = POSITIONAL_ENCODINGS.get("none")(4, 8)
    layer = ATTENTION.get(name)(32, 4, pe)
    assert layer.tau_index == "alg1" and layer.threshold_params()["tau_index"] == "alg1"
    assert ATTENTION.get(name)(32, 4, pe, tau_index="eq1").tau_index == "eq1"
    with pytest.raises(ValueError, match="tau_index"):
        ATTENTION.get(name)(32, 4, pe, tau_index="eq3")


# -- SSMax, ASSMax, ASEntmax: the sparse-attention authors' values ------------------------------------------------

def test_ssmax_defaults_are_the_authors():
    """``softmax(s * log(r + 2) * z)`` with ``s`` 1 (their ``log_position`` and ``"nakanishi"`` start)."""
    tokens = 12
    z = cosine_scores(tokens, 8, seed=5) * 4
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    factor = torch.log(torch.arange(tokens, dtype=torch.float64) + 2)[:, None]
    theirs = torch.softmax(torch.where(causal, z * factor, float("-inf")), dim=-1)
    torch.testing.assert_close(attention_weights("ssmax", z), theirs, rtol=0, atol=1e-12)
    nakanishi = torch.softmax(torch.where(causal, z * 0.43 * torch.log(factor.exp() - 1), float("-inf")), dim=-1)
    torch.testing.assert_close(attention_weights("ssmax", z, s=0.43, log_offset=0), nakanishi, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["ssmax", "assmax", "asentmax"])
def test_scaled_defaults_under_nape(name):
    from lengthbench.models.positional import POSITIONAL_ENCODINGS

    layer = ATTENTION.get(name)(32, 4, POSITIONAL_ENCODINGS.get("nape")(4, 8))
    assert layer.scaled_heads == "nope" and not layer.scales_every_head
    if name == "ssmax":
        assert torch.equal(layer.s.detach(), torch.ones(4)) and layer.log_offset == 1
    else:
        assert layer.gamma_scale == 2.0
    alibi = ATTENTION.get(name)(32, 4, POSITIONAL_ENCODINGS.get("alibi")(4, 8))
    assert alibi.scales_every_head  # every head has a slope: every head is scaled, as without NAPE


# -- Sieve: which form is `sieve`, which `sieve-window` ---------------------------------------------------------------------------------

def test_sieve_is_section_3_and_the_window_is_algorithm_1():
    """``sieve`` is Sieve Attention's Section 3: stick-breaking over the 1.5-entmax support of the earlier scores
    (Eqs. 5-7), the weights on the earlier tokens only (no remainder); ``sieve-window`` is its Algorithm 1's filter (every earlier key breaks the stick, weights kept
    within eps of the row's max), eps 2 by default; each with its own op."""
    from entmax import entmax15

    from lengthbench.models.attention import KERNELS

    z = cosine_scores(40, 8, seed=7) * 12
    sieve, window = attention_weights("sieve", z), attention_weights("sieve-window", z, eps=8.0)
    assert not torch.equal(sieve, window) and not torch.equal(window, attention_weights("sieve-window", z))
    row = 30
    earlier = z[0, 0, row, :row]
    sig = torch.sigmoid(earlier)
    # Section 3 by hand on one row: the stick broken by the entmax support only, zero elsewhere
    support = entmax15(earlier, dim=-1) > 0
    stick = torch.stack([sig[j] * torch.prod(torch.where(support[j + 1:], 1 - sig[j + 1:], 1.0)) for j in range(row)])
    torch.testing.assert_close(sieve[0, 0, row, :row], torch.where(support, stick, 0.0))
    assert sieve[0, 0, row, row] == 0 and (sieve[0, 0, 0] == 0).all()  # Eq. 7: no remainder, row 0 all zero
    # Algorithm 1 by hand: earlier keys within eps of their max keep their stick-breaking weight
    keep = earlier >= earlier.max() - 8.0
    stick = torch.stack([sig[j] * torch.prod(1 - sig[j + 1:]) for j in range(row)])
    torch.testing.assert_close(window[0, 0, row, :row], torch.where(keep, stick, 0.0))
    torch.testing.assert_close(window[0, 0, row, row], torch.prod(1 - sig))
    assert KERNELS.get("sieve") == "lengthbench.kernels.sieve:sieve_attention"
    assert KERNELS.get("sieve-window") == "lengthbench.kernels.sieve:sieve_window_attention"
    from lengthbench.models.positional import POSITIONAL_ENCODINGS

    pe = POSITIONAL_ENCODINGS.get("none")(4, 8)
    assert ATTENTION.get("sieve")(32, 4, pe).alpha == 1.5 and ATTENTION.get("sieve-window")(32, 4, pe).eps == 2.0
    assert ATTENTION.get("sieve")(32, 4, pe).remainder == "drop"


# -- the TRA and TDA kernels, both conventions (GPU, or the Triton interpreter on the CPU) -------------------------

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs a CUDA GPU or TRITON_INTERPRET=1")
DEVICE = "cuda" if CUDA else "cpu"


def unit_inputs(count, tokens, head_dim, seed, batch=1, heads=2):
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(batch, heads, tokens, head_dim, generator=gen) for _ in range(count)]
    tensors[:-1] = [torch.nn.functional.normalize(t, dim=-1) for t in tensors[:-1]]
    return [t.to(DEVICE) for t in tensors]


def rel(a, b):
    """Relative error, with an absolute floor of 1e-6 for gradients near zero (a scalar's sum of cancelling
    fp32 terms)."""
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-2)).item()


@needs_triton
@pytest.mark.parametrize("tau_index", ["alg1", "eq1"])
@pytest.mark.parametrize("tokens", [1, 17, 33])
def test_tra_kernel_matches_reference(tokens, tau_index):
    pytest.importorskip("triton")
    from lengthbench.kernels.tra import tra_attention

    head_dim = 16
    q, k, v = unit_inputs(3, tokens, head_dim, seed=tokens)
    beta = torch.tensor(0.6, device=DEVICE)
    mine = [t.clone().requires_grad_() for t in (q, k, v, beta)]
    theirs = [t.double().clone().requires_grad_() for t in (q, k, v, beta)]
    out = tra_attention(*mine[:3], beta=mine[3], tau_index=tau_index)
    w = attention_weights("tra", theirs[0] @ theirs[1].transpose(-1, -2), head_dim=head_dim, beta=theirs[3],
                          tau_index=tau_index)
    ref = w @ theirs[2]
    assert rel(out, ref) < 1e-5
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE)
    (out.double() * dout).sum().backward()
    (ref * dout).sum().backward()
    for a, b in zip(mine, theirs, strict=True):
        assert rel(a.grad, b.grad) < 1e-4


@needs_triton
@pytest.mark.parametrize("tau_index", ["alg1", "eq1"])
@pytest.mark.parametrize("tokens", [1, 17, 33])
def test_tda_kernel_matches_reference(tokens, tau_index):
    pytest.importorskip("triton")
    from lengthbench.kernels.tda import tda_attention

    head_dim = 16
    q1, k1, q2, k2, v = unit_inputs(5, tokens, head_dim, seed=100 + tokens)
    lam, beta = torch.tensor(0.4, device=DEVICE), torch.tensor(0.7, device=DEVICE)
    mine = [t.clone().requires_grad_() for t in (q1, k1, q2, k2, v, lam, beta)]
    theirs = [t.double().clone().requires_grad_() for t in (q1, k1, q2, k2, v, lam, beta)]
    out = tda_attention(*mine[:5], lam=mine[5], beta=mine[6], tau_index=tau_index)
    a = theirs
    w = attention_weights("tda", a[0] @ a[1].transpose(-1, -2), scores2=a[2] @ a[3].transpose(-1, -2),
                          head_dim=head_dim, lam=a[5], beta=a[6], tau_index=tau_index)
    ref = w @ a[4]
    assert rel(out, ref) < 1e-5
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(DEVICE)
    (out.double() * dout).sum().backward()
    (ref * dout).sum().backward()
    for x, y in zip(mine, theirs, strict=True):
        assert rel(x.grad, y.grad) < 1e-4


@needs_triton
@pytest.mark.parametrize("per_head", ["lam", "beta"])
@pytest.mark.parametrize("tokens", [1, 17, 33, 40])
def test_tda_whole_row_backward_matches_reference(tokens, per_head):
    """The ``rows`` backward (one program a head, every row in one query tile of 64, key tiles of 16) against the
    float64 reference, with ALiBi slopes and a row factor so that every gradient it sums is checked, ``lam`` or
    ``beta`` one per head (the other one for all: the kernel sums their gradients per head or over every head);
    at 40 tokens the last key tile is partly past the rows, at 33 it holds one key."""
    pytest.importorskip("triton")
    from lengthbench.kernels.tda import tda_attention

    head_dim, heads = 16, 2
    q1, k1, q2, k2, v = unit_inputs(5, tokens, head_dim, seed=200 + tokens)
    gen = torch.Generator().manual_seed(tokens)
    slopes = torch.tensor([0.25, 0.0]).to(DEVICE)
    row_scale = (0.5 + torch.rand(1, heads, tokens, generator=gen)).to(DEVICE)
    lam, beta = torch.tensor([0.3, 0.6]).to(DEVICE), torch.tensor(0.5, device=DEVICE)
    if per_head == "beta":
        lam, beta = torch.tensor(0.3, device=DEVICE), torch.tensor([0.5, 0.8]).to(DEVICE)
    named = (q1, k1, q2, k2, v, slopes, row_scale, lam, beta)
    mine = [t.clone().requires_grad_() for t in named]
    theirs = [t.double().clone().requires_grad_() for t in named]
    out = tda_attention(*mine[:5], slopes=mine[5], row_scale=mine[6], lam=mine[7], beta=mine[8],
                        tuning={"map": 0, "rows": [64, 16, 4]})
    a = theirs
    pos = torch.arange(tokens, device=DEVICE)
    bias = a[5][:, None, None] * (pos[:, None] - pos[None, :]).double()
    z1, z2 = ((x @ y.transpose(-1, -2) - bias) * a[6][..., None] for x, y in ((a[0], a[1]), (a[2], a[3])))
    w = attention_weights("tda", z1, scores2=z2, head_dim=head_dim, lam=a[7], beta=a[8])
    ref = w @ a[4]
    assert rel(out, ref) < 1e-5
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(DEVICE)
    (out.double() * dout).sum().backward()
    (ref * dout).sum().backward()
    names = ["q1", "k1", "q2", "k2", "v", "slopes", "row_scale", "lam", "beta"]
    for name, x, y in zip(names, mine, theirs, strict=True):
        assert rel(x.grad, y.grad) < 1e-4, name
