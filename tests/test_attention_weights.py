"""The reference weight maps (``attention_weights``) against their formulas, on hand-made cases."""

from __future__ import annotations

import math

import pytest
import torch
from entmax import entmax15

from lengthbench import attention_weights
from lengthbench.models.attention import WEIGHT_FUNCTIONS, causal_mask


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from threads, and on a loaded 2-core machine two threads per op made
    these tests ~15x slower (spinning workers); the previous setting comes back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

SUM_TO_ONE = {"softmax", "gated", "ssmax", "assmax", "adatemp", "entmax", "sparsemax", "sentmax", "asentmax",
              "stickbreaking"}  # (Sieve's rows, Eq. 7: one less the stick its support leaves)
NON_NEGATIVE = SUM_TO_ONE | {"sieve", "softpick", "scalable-softpick", "rectified", "rela", "tra"}
HEAD_DIM = 4


def extra_params(name: str, like: torch.Tensor) -> dict:
    """The parameters without defaults: tra/tda need head_dim, two-view maps a second score matrix."""
    params = {}
    if name in ("tra", "tda"):
        params["head_dim"] = HEAD_DIM
    if name in ("tda", "diffsoftmax"):
        params["scores2"] = like.flip(-1).clone()
    return params


def weights(name, scores, **params):
    return attention_weights(name, scores, **{**extra_params(name, scores), **params})


def random_scores(*shape, seed=0, scale=2.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# -- properties every map has ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", WEIGHT_FUNCTIONS.names())
def test_shape_causal_zeros_and_row_sums(name):
    scores = random_scores(2, 3, 6, 6)
    w = weights(name, scores)
    assert w.shape == scores.shape and w.dtype == torch.float32
    assert torch.isfinite(w).all()
    upper = ~causal_mask(torch.arange(6), 6)
    assert (w[..., upper] == 0).all(), "entries j > r must be exact zeros"
    if name in SUM_TO_ONE:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 6))
    if name in NON_NEGATIVE:
        assert (w >= 0).all()


@pytest.mark.parametrize("name", WEIGHT_FUNCTIONS.names())
@pytest.mark.parametrize("case", ["all_negative", "minus_inf", "length_one", "large", "float64"])
def test_edge_cases_no_nan(name, case):
    if case == "all_negative":
        scores = -5 - random_scores(5, 5).abs()
    elif case == "minus_inf":
        scores = random_scores(5, 5)
        scores[:, :3] = float("-inf")  # rows 0-2 see only -inf, later rows a mix
    elif case == "length_one":
        scores = torch.tensor([[0.7]])
    elif case == "large":
        scores = random_scores(5, 5, scale=100.0)
    else:
        scores = random_scores(5, 5).double()
    w = weights(name, scores)
    assert not torch.isnan(w).any() and torch.isfinite(w).all()
    assert w.dtype == (torch.float64 if case == "float64" else torch.float32)
    assert (w[~causal_mask(torch.arange(len(w)), len(w))] == 0).all()
    if name in {"stickbreaking", "sieve"} or (name in SUM_TO_ONE and case != "minus_inf"):
        # (Sieve's rows: one less the stick its support leaves, which the diagonal form puts on the diagonal)
        left = torch.diagonal(weights(name, scores, remainder="diagonal")) if name == "sieve" else 0.0
        torch.testing.assert_close(w.sum(-1) + left, torch.ones(len(w), dtype=w.dtype))


@pytest.mark.parametrize("name", WEIGHT_FUNCTIONS.names())
def test_rows_of_a_longer_map_know_their_position(name):
    """The last rows of a map, given alone (as a query chunk is), equal those rows of the full map."""
    scores = random_scores(2, 7, 7)
    extra = extra_params(name, scores)
    full = WEIGHT_FUNCTIONS.get(name)(scores, causal_mask(torch.arange(7), 7), **extra)
    rows = torch.arange(4, 7)
    tail_extra = {k: (v[..., 4:, :] if torch.is_tensor(v) else v) for k, v in extra.items()}
    tail = WEIGHT_FUNCTIONS.get(name)(scores[..., 4:, :], causal_mask(rows, 7), **tail_extra)
    torch.testing.assert_close(tail, full[..., 4:, :])
    explicit = WEIGHT_FUNCTIONS.get(name)(scores[..., 4:, :], causal_mask(rows, 7), query_positions=rows, **tail_extra)
    torch.testing.assert_close(explicit, full[..., 4:, :])


@pytest.mark.parametrize("name", WEIGHT_FUNCTIONS.names())
def test_gradients_are_finite(name):
    scores = random_scores(4, 4).double().requires_grad_()
    scores_with_inf = scores.detach().clone()
    scores_with_inf[2, 0] = float("-inf")
    for s in (scores, scores_with_inf.requires_grad_()):
        weights(name, s).pow(2).sum().backward()
        assert torch.isfinite(s.grad).all()


def test_attention_weights_rejects_non_square():
    with pytest.raises(ValueError, match="square"):
        attention_weights("softmax", torch.zeros(3, 4))


# -- each map against its formula ----------------------------------------------------------------------
def naive_softmax(values):
    e = [math.exp(v) for v in values]
    return [x / sum(e) for x in e]


def test_softmax_formula():
    z = random_scores(4, 4)
    w = weights("softmax", z)
    for r in range(4):
        torch.testing.assert_close(w[r, : r + 1], torch.tensor(naive_softmax(z[r, : r + 1].tolist())))


def test_ssmax_formula():
    """``s * log(r + 2)`` by default (the sparse-attention authors' code); ``log_offset=0``: Nakanishi's log(r + 1)."""
    z = random_scores(5, 5)
    for offset in (1, 0):
        w = weights("ssmax", z, s=torch.tensor(0.9), log_offset=offset)
        for r in range(5):
            factor = 0.9 * math.log(r + 1 + offset)
            expected = torch.tensor(naive_softmax([factor * v for v in z[r, : r + 1].tolist()]))
            torch.testing.assert_close(w[r, : r + 1], expected)
        assert w[0, 0] == 1  # one key, weight one
    torch.testing.assert_close(weights("ssmax", z), weights("ssmax", z, s=1.0, log_offset=1))


@pytest.mark.parametrize("name", ["assmax", "asentmax", "sentmax"])
def test_adaptive_scaling_uses_log_r_plus_2(name):
    z = random_scores(5, 5)
    beta, gamma, delta = 0.7, -0.5, 1.0
    w = weights(name, z, beta=beta, gamma=gamma, delta=delta)
    for r in range(5):
        factor = delta + beta * math.log(r + 2) ** gamma
        scaled = factor * z[r, : r + 1]
        expected = torch.softmax(scaled, -1) if name == "assmax" else entmax15(scaled, dim=-1)
        torch.testing.assert_close(w[r, : r + 1], expected)


def test_asentmax_per_row_parameters():
    z = random_scores(2, 4, 4)
    beta = torch.rand(2, 4)
    gamma = torch.rand(2, 4) - 0.5
    w = weights("asentmax", z, beta=beta, gamma=gamma)
    for b in range(2):
        for r in range(4):
            factor = 1 + beta[b, r] * math.log(r + 2) ** gamma[b, r]
            torch.testing.assert_close(w[b, r, : r + 1], entmax15(factor * z[b, r, : r + 1], dim=-1))


def test_entmax_is_a_thresholded_power():
    """1.5-entmax: p = (z/2 - tau)_+^2; tau = z/2 - sqrt(p) is one number over the support, above the rest."""
    z = random_scores(6, 6, scale=3.0)
    w = weights("entmax", z)
    for r in range(6):
        p, row = w[r, : r + 1], z[r, : r + 1]
        support = p > 0
        tau = row[support] / 2 - p[support].sqrt()
        torch.testing.assert_close(tau, tau[:1].expand_as(tau))
        assert (row[~support] / 2 <= tau[0] + 1e-6).all()
    torch.testing.assert_close(weights("entmax", torch.zeros(3, 3))[2], torch.full((3,), 1 / 3))


def test_sparsemax_hand_values():
    z = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    torch.testing.assert_close(weights("sparsemax", z)[1], torch.tensor([1.0, 0.0]))
    z = torch.tensor([[0.0, 0.0], [0.5, 0.0]])
    torch.testing.assert_close(weights("sparsemax", z)[1], torch.tensor([0.75, 0.25]))


def test_entmax_other_alpha_by_bisection():
    z = random_scores(5, 5)
    w = weights("entmax", z, alpha=1.3)
    torch.testing.assert_close(w.sum(-1), torch.ones(5))
    assert (w[~causal_mask(torch.arange(5), 5)] == 0).all()


def test_adatemp_formula():
    z = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.1, 0.0, -0.1, 0.0], [9.0, 0.0, 0.0, 0.0]])
    w = weights("adatemp", z)
    # Row 1 (two equal keys): H = log 2 = 0.69 > 0.5, poly(0.69) < 1, so theta = 1.
    torch.testing.assert_close(w[1, :2], torch.tensor([0.5, 0.5]))
    # Row 2: H close to log 3; theta = poly(H) > 1 sharpens.
    p = torch.softmax(z[2, :3], -1)
    entropy = -(p * torch.log(p + 1e-9)).sum().item()
    poly = -0.037 * entropy**4 + 0.481 * entropy**3 - 2.3 * entropy**2 + 4.917 * entropy - 1.791
    assert entropy > 0.5 and poly > 1
    torch.testing.assert_close(w[2, :3], torch.softmax(poly * z[2, :3], -1))
    # Row 3: low entropy (< 0.5): untouched softmax.
    torch.testing.assert_close(w[3], torch.softmax(z[3], -1))


def naive_stick_breaking(row, r, support=None):
    """a_j = sigmoid(z_j) prod_{j<k<r, k in S} (1 - sigmoid(z_k)) over S (default all j < r), rest to a_r."""
    support = list(range(r)) if support is None else support
    out = [0.0] * (r + 1)
    for j in support:
        out[j] = sigmoid(row[j])
        for k in support:
            if k > j:
                out[j] *= 1 - sigmoid(row[k])
    out[r] = 1.0
    for k in support:
        out[r] *= 1 - sigmoid(row[k])
    return out


def test_stickbreaking_formula():
    z = random_scores(6, 6)
    w = weights("stickbreaking", z)
    for r in range(6):
        torch.testing.assert_close(w[r, : r + 1], torch.tensor(naive_stick_breaking(z[r].tolist(), r)))
    z = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.0, -1.0, 0.0]])
    w = weights("stickbreaking", z)
    torch.testing.assert_close(w[0], torch.tensor([1.0, 0.0, 0.0]))  # row 0: nothing earlier, all remainder
    torch.testing.assert_close(w[1, :2], torch.tensor([sigmoid(2.0), 1 - sigmoid(2.0)]))
    expected = [sigmoid(1.0) * (1 - sigmoid(-1.0)), sigmoid(-1.0), (1 - sigmoid(1.0)) * (1 - sigmoid(-1.0))]
    torch.testing.assert_close(w[2], torch.tensor(expected))


def test_stickbreaking_remainder_dropped():
    """``remainder="drop"``: the same weights on the earlier keys, nothing on the diagonal (Sieve Attention's Eq. 7
    over the earlier tokens only); a row sums to one minus what was left of its stick."""
    z = random_scores(2, 7, 7)
    kept, dropped = weights("stickbreaking", z), weights("stickbreaking", z, remainder="drop")
    eye = torch.eye(7, dtype=torch.bool)
    torch.testing.assert_close(dropped, torch.where(eye, torch.zeros(()), kept))
    left = torch.stack([torch.prod(1 - torch.sigmoid(z[..., r, :r]), -1) for r in range(7)], -1)
    torch.testing.assert_close(dropped.sum(-1), 1 - left)
    assert (dropped[..., 0, :] == 0).all()  # the first row has nothing earlier to attend to
    z.requires_grad_()
    weights("stickbreaking", z.masked_fill(~eye.tril(), float("-inf")), remainder="drop").sum().backward()
    assert torch.isfinite(z.grad).all()
    with pytest.raises(ValueError, match="remainder"):
        weights("stickbreaking", z, remainder="query")


def test_stickbreaking_is_stable_in_log_space():
    z = torch.full((300, 300), 30.0)  # products of 1 - sigmoid(30) underflow in linear space
    w = weights("stickbreaking", z)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(300))
    torch.testing.assert_close(w[-1, -2], torch.tensor(sigmoid(30.0)))


def test_sieve_formula_and_support():
    """``remainder="diagonal"``: stick-breaking over the support, the stick left on the diagonal (row 0 all of it)."""
    z = random_scores(7, 7, scale=3.0)
    w = weights("sieve", z, remainder="diagonal")
    for r in range(7):
        if r == 0:
            torch.testing.assert_close(w[0, :1], torch.ones(1))
            continue
        candidates = entmax15(z[r, :r], dim=-1)
        support = [j for j in range(r) if candidates[j] > 0]
        torch.testing.assert_close(w[r, : r + 1], torch.tensor(naive_stick_breaking(z[r].tolist(), r, support)))
        outside = [j for j in range(r) if j not in support]
        assert (w[r, outside] == 0).all(), "zero outside the entmax support"


def test_sieve_hand_case():
    # Row 3 sees keys 0, 1, 2 with scores 4, -4, 3.5: entmax keeps keys 0 and 2 only.
    z = torch.zeros(4, 4)
    z[3, :3] = torch.tensor([4.0, -4.0, 3.5])
    w = weights("sieve", z, remainder="diagonal")[3]
    a2 = sigmoid(3.5)
    a0 = sigmoid(4.0) * (1 - sigmoid(3.5))
    torch.testing.assert_close(w, torch.tensor([a0, 0.0, a2, (1 - sigmoid(4.0)) * (1 - sigmoid(3.5))]))
    # Equal scores keep every key in the support: Sieve equals stick-breaking (of the same remainder).
    flat = torch.full((5, 5), 0.3)
    torch.testing.assert_close(weights("sieve", flat, remainder="diagonal"), weights("stickbreaking", flat))
    torch.testing.assert_close(weights("sieve", flat), weights("stickbreaking", flat, remainder="drop"))


def test_sieve_window_is_masked_stick_breaking():
    """Sieve's Algorithm 1 window: stick-breaking over every earlier key, zero where z < rowmax - eps; a huge eps is
    stick-breaking itself; the filter passes no gradient."""
    z = random_scores(7, 7, scale=3.0)
    w, sb = weights("sieve-window", z, eps=2.0), weights("stickbreaking", z)
    for r in range(1, 7):
        kept = [j for j in range(r) if z[r, j] >= z[r, :r].max() - 2.0]
        assert len(kept) >= 1
        torch.testing.assert_close(w[r, kept], sb[r, kept])
        assert all(w[r, j] == 0 for j in range(r) if j not in kept)
        torch.testing.assert_close(w[r, r], sb[r, r])  # the remainder: the stick of all earlier keys
    torch.testing.assert_close(weights("sieve-window", z, eps=1e9), sb)
    # Row 3 sees 4, -4, 3.5: eps 2 drops key 1, whose stick still counts.
    hand = torch.zeros(4, 4)
    hand[3, :3] = torch.tensor([4.0, -4.0, 3.5])
    expected = torch.tensor([sigmoid(4.0) * (1 - sigmoid(-4.0)) * (1 - sigmoid(3.5)), 0.0, sigmoid(3.5),
                             (1 - sigmoid(4.0)) * (1 - sigmoid(-4.0)) * (1 - sigmoid(3.5))])
    torch.testing.assert_close(weights("sieve-window", hand)[3], expected)
    hand.requires_grad_()
    weights("sieve-window", hand)[3, 0].backward()
    assert hand.grad[3, 1] != 0  # key 1 is filtered out but breaks the stick: it gets a gradient


def test_sieve_window_default_holds_every_sieve_support():
    """sieve-window's default eps (2 = 1 / (alpha - 1) at Sieve's alpha 1.5) is the narrowest window that holds the
    1.5-entmax support of every row: each key that Sieve keeps lies within 2 of the row's largest earlier score, and
    a row of two earlier keys keeps both in its support exactly where they are within 2 of each other."""
    from lengthbench.kernels.defaults import SIEVE_ALPHA, SIEVE_WINDOW_EPS
    from lengthbench.models.attention.stickbreaking import sieve_support

    assert SIEVE_WINDOW_EPS == 1.0 / (SIEVE_ALPHA - 1.0) == 2.0
    earlier = torch.ones(40, 40, dtype=torch.bool).tril(-1)
    for scale in (0.3, 1.0, 3.0, 10.0):
        z = random_scores(40, 40, scale=scale)
        kept = sieve_support(z, earlier)
        rowmax = z.masked_fill(~earlier, float("-inf")).amax(-1, keepdim=True)
        assert not (kept & (z < rowmax - SIEVE_WINDOW_EPS)).any(), scale
    for second, both in ((3.01, True), (2.99, False)):
        two = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [5.0, second, 0.0]])
        assert sieve_support(two, earlier[:3, :3])[2, :2].tolist() == [True, both]
        assert (weights("sieve-window", two)[2, :2] > 0).tolist() == [True, both]


def test_sieve_remainder_dropped_is_eq7():
    """``remainder="drop"``, the default: Sieve Attention's Eq. 7 as printed, over the earlier tokens only: ``a_{i_m} =
    sigmoid(z_{i_m}) prod_{l > m} (1 - sigmoid(z_{i_l}))`` over the 1.5-entmax support, products in plain linear
    space here; nothing on the diagonal (the first row is all zero), a row sums to one minus the stick left by the
    support; ``remainder="diagonal"`` puts that remainder on the diagonal, the same weights elsewhere."""
    z = random_scores(2, 9, 9, scale=3.0).double()
    dropped, kept = weights("sieve", z), weights("sieve", z, remainder="diagonal")
    torch.testing.assert_close(dropped, weights("sieve", z, remainder="drop"))
    one_key_rows = 0
    for b in range(2):
        for r in range(9):
            support = [j for j in range(r) if entmax15(z[b, r, :r], dim=-1)[j] > 0] if r else []
            one_key_rows += len(support) == 1
            expected = torch.zeros(9, dtype=torch.float64)
            for m, j in enumerate(support):
                expected[j] = torch.sigmoid(z[b, r, j]) * torch.prod(1 - torch.sigmoid(z[b, r, support[m + 1:]]))
            torch.testing.assert_close(dropped[b, r], expected)
            left = torch.prod(1 - torch.sigmoid(z[b, r, support]))
            torch.testing.assert_close(kept[b, r], expected + left * torch.eye(9, dtype=torch.float64)[r])
    assert one_key_rows > 0  # rows whose support is one key are among them
    hand = torch.zeros(4, 4)
    hand[3, :3] = torch.tensor([4.0, -4.0, 3.5])  # the support of row 3: keys 0 and 2
    torch.testing.assert_close(weights("sieve", hand, remainder="drop")[3],
                               torch.tensor([sigmoid(4.0) * (1 - sigmoid(3.5)), 0.0, sigmoid(3.5), 0.0]))
    with pytest.raises(ValueError, match="remainder"):
        weights("sieve", hand, remainder="query")


def test_sieve_support_has_no_gradient():
    z = torch.zeros(3, 3)
    z[2, :2] = torch.tensor([3.0, -3.0])  # key 1 is outside the support of row 2
    z.requires_grad_()
    weights("sieve", z)[2].sum().backward()
    assert z.grad[2, 1] == 0


def naive_softpick(values, eps=1e-6):
    num = [max(math.exp(v) - 1, 0.0) for v in values]
    den = sum(abs(math.exp(v) - 1) for v in values) + eps
    return [x / den for x in num]


def test_softpick_formula():
    z = random_scores(5, 5)
    w = weights("softpick", z)
    for r in range(5):
        torch.testing.assert_close(w[r, : r + 1], torch.tensor(naive_softpick(z[r, : r + 1].tolist())))
    assert (weights("softpick", -torch.ones(4, 4)) == 0).all()  # all negative: all zero
    torch.testing.assert_close(weights("softpick", torch.zeros(1, 1)), torch.zeros(1, 1))  # 0 / eps


def test_scalable_softpick_formula():
    z = random_scores(5, 5)
    w = weights("scalable-softpick", z, s=torch.tensor(1.5))
    for r in range(5):
        factor = 1.5 * math.log(r + 1)
        torch.testing.assert_close(w[r, : r + 1], torch.tensor(naive_softpick([factor * v for v in z[r, : r + 1].tolist()])))


def test_rectified_formula():
    z = torch.tensor([[-1.0, 0, 0], [0.5, -2.0, 0], [1.0, 0.0, -3.0]])
    w = weights("rectified", z)
    torch.testing.assert_close(w[0], torch.zeros(3))  # no z >= 0: all zero
    torch.testing.assert_close(w[1], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(w[2], torch.tensor([*naive_softmax([1.0, 0.0]), 0.0]))


def test_rela_formula():
    z = random_scores(4, 4)
    torch.testing.assert_close(weights("rela", z), torch.relu(z).tril())


def tra_naive(s, r, head_dim=HEAD_DIM, beta=1.0, kappa=1.0, power=2.0, offset=0):
    """``offset`` 0: Algorithm 1's log((r + 1) / kappa) for 0-based row r; 1: Eq. 1's log((r + 2) / kappa)."""
    tau = beta * math.sqrt(2 * max(0.0, math.log((r + 1 + offset) / kappa)) / head_dim)
    return max(s - tau, 0.0) ** power


def test_tra_formula():
    s = torch.rand(6, 6) * 2 - 1
    for tau_index, offset in (("alg1", 0), ("eq1", 1)):
        for beta, kappa, power in [(1.0, 1.0, 2.0), (0.5, 3.0, 1.0)]:
            w = weights("tra", s, beta=beta, kappa=kappa, power=power, tau_index=tau_index)
            expected = torch.tensor([[tra_naive(s[r, j].item(), r, HEAD_DIM, beta, kappa, power, offset)
                                      if j <= r else 0.0 for j in range(6)] for r in range(6)])
            torch.testing.assert_close(w, expected)
    torch.testing.assert_close(weights("tra", s), weights("tra", s, tau_index="alg1"))
    # Row 0 (n = 1) under Eq. 1: tau = sqrt(2 log 2 / d); a cosine of 1 survives, 0.5 does not (d = 4: tau = 0.59).
    w = weights("tra", torch.tensor([[1.0, 0], [0.5, 0.5]]), tau_index="eq1")
    torch.testing.assert_close(w[0, 0], torch.tensor((1 - math.sqrt(2 * math.log(2) / 4)) ** 2))
    assert w[1, 0] == 0
    # Under Algorithm 1 row 0's threshold is 0 (log 1) and row 1's sqrt(2 log 2 / d).
    w = weights("tra", torch.tensor([[1.0, 0], [0.5, 0.5]]))
    assert w[0, 0] == 1 and w[1, 0] == 0


def test_tra_needs_head_dim():
    with pytest.raises(TypeError, match="head_dim"):
        attention_weights("tra", torch.zeros(2, 2))


def test_tda_and_diffsoftmax_formulas():
    s1, s2 = torch.rand(5, 5), torch.rand(5, 5)
    tda = attention_weights("tda", s1, scores2=s2, head_dim=HEAD_DIM, lam=0.3)
    torch.testing.assert_close(tda, weights("tra", s1) - 0.3 * weights("tra", s2))
    diff = attention_weights("diffsoftmax", s1, scores2=s2, lam=0.6)
    torch.testing.assert_close(diff, weights("softmax", s1) - 0.6 * weights("softmax", s2))
    torch.testing.assert_close(attention_weights("diffsoftmax", s1, scores2=s2).sum(-1), torch.full((5,), 0.8))


def test_per_head_parameters_broadcast():
    z = random_scores(2, 3, 4, 4)
    s = torch.tensor([0.1, 0.5, 2.0])
    w = weights("ssmax", z, s=s)
    for h in range(3):
        torch.testing.assert_close(w[:, h], weights("ssmax", z[:, h], s=float(s[h])))


def test_adaptive_scale_is_the_papers_power_with_its_gradients():
    """``delta + beta * log(n + 1) ** gamma`` (Long-Context Generalization with Sparse Attention), written as ``exp(gamma * log(log(n + 1)))`` since
    the earlier formula: the same values, and the analytic gradients ``dS/dbeta = L ** gamma`` and
    ``dS/dgamma = beta * L ** gamma * log L`` with ``L = log(n + 1)``, at every ``n`` from the first token."""
    from lengthbench.models.attention.scaled import adaptive_scale

    counts = torch.arange(1, 70, dtype=torch.float64)[:, None]  # n_r = r + 1
    generator = torch.Generator().manual_seed(0)
    beta = torch.rand(2, 3, 69, generator=generator, dtype=torch.float64).add(0.1).requires_grad_()
    gamma = torch.rand(2, 3, 69, generator=generator, dtype=torch.float64).mul(2).sub(1).requires_grad_()
    scale = adaptive_scale(counts, beta, gamma, 1.0)
    log_n = torch.log(counts + 1)
    expected = 1.0 + beta[..., None] * log_n ** gamma[..., None]
    torch.testing.assert_close(scale, expected, rtol=1e-12, atol=0)
    scale.sum().backward()
    power = log_n[:, 0] ** gamma.detach()
    torch.testing.assert_close(beta.grad, power, rtol=1e-12, atol=0)
    torch.testing.assert_close(gamma.grad, beta.detach() * power * torch.log(log_n[:, 0]), rtol=1e-12, atol=1e-15)
    assert torch.autograd.gradcheck(lambda b, g: adaptive_scale(counts, b, g, 0.5), (beta, gamma))
    # floats (the weight functions' defaults): gamma 0 gives delta + beta
    torch.testing.assert_close(adaptive_scale(counts, 0.7, 0.0, 1.0), torch.full_like(counts, 1.7))
