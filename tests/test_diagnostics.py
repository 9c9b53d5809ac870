"""Attention diagnostics on hand-made weight maps with known values, and on a tiny decoder."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lengthbench.diagnostics import (
    map_diagnostics,
    measure_attention,
    real_lengths,
    row_statistics,
    sample_rows,
)
from lengthbench.models.attention import ATTENTION, attention_weights
from lengthbench.models.decoder import Decoder, ModelConfig


def uniform_map(length: int) -> torch.Tensor:
    """Row r: 1 / (r + 1) on keys 0..r."""
    return torch.tril(torch.ones(length, length)) / torch.arange(1, length + 1)[:, None]


def diagonal_map(length: int) -> torch.Tensor:
    return torch.eye(length)


def sink_map(length: int) -> torch.Tensor:
    w = torch.zeros(length, length)
    w[:, 0] = 1.0
    return w


def test_uniform_rows_have_entropy_one_and_no_zeros():
    length = 20
    d = map_diagnostics(uniform_map(length)[None])
    assert d["entropy"] == pytest.approx(1.0, abs=1e-6)
    assert d["sparsity"] == 0.0
    assert d["support"] == pytest.approx(sum(range(1, length + 1)) / length)
    # first-token weight: mean of 1/(r+1) over rows, below the sink thresholds
    assert d["per_head"]["first_token_weight"][0][0] == pytest.approx(sum(1 / n for n in range(1, 21)) / 20)
    assert d["sink_rate"] == 0.0 and d["diagnostic_rows"] == length


def test_one_hot_rows_have_entropy_zero_and_known_zero_count():
    length = 6
    d = map_diagnostics(diagonal_map(length)[None])
    assert d["entropy"] == pytest.approx(0.0, abs=1e-7)
    causal = length * (length + 1) / 2
    assert d["sparsity"] == pytest.approx((causal - length) / causal)
    assert d["support"] == 1.0


def test_sink_head_counts_at_both_thresholds_and_summary_is_a_head_mean():
    length = 20
    heads = torch.stack([sink_map(length), uniform_map(length), diagonal_map(length),
                         0.25 * sink_map(length) + 0.75 * diagonal_map(length)])
    d = map_diagnostics(heads)  # one layer, four heads
    first = d["per_head"]["first_token_weight"][0]
    assert first[0] == 1.0  # all mass on token 0
    assert first[1] == pytest.approx(sum(1 / n for n in range(1, length + 1)) / length)  # 0.18
    assert first[2] == pytest.approx(1 / length)  # only row 0 puts weight on token 0
    assert first[3] == pytest.approx((1.0 + 0.25 * (length - 1)) / length)  # 0.2875
    assert d["sink_rate"] == pytest.approx(1 / 4)  # only head 0 exceeds 0.3
    assert d["sink_rate_0.2"] == pytest.approx(2 / 4)  # heads 0 and 3 exceed 0.2
    assert d["per_head"]["entropy"][0][0] == pytest.approx(0.0, abs=1e-7)
    assert d["per_head"]["sparsity"][0][0] == pytest.approx(1 - length / (length * (length + 1) / 2))
    assert d["sparsity"] == pytest.approx(sum(d["per_head"]["sparsity"][0]) / 4)
    assert d["entropy"] == pytest.approx(sum(d["per_head"]["entropy"][0]) / 4)
    json.dumps(d, allow_nan=False)


def test_sink_rate_is_a_share_over_all_heads_of_all_layers():
    length = 20
    layers = torch.stack([torch.stack([sink_map(length), uniform_map(length)]),
                          torch.stack([sink_map(length), sink_map(length)])])
    d = map_diagnostics(layers)
    assert d["sink_rate"] == pytest.approx(3 / 4)
    assert len(d["per_head"]["sparsity"]) == 2 and len(d["per_head"]["sparsity"][0]) == 2


def test_known_zero_count_and_support_of_a_hand_made_map():
    w = torch.tensor([
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],  # one zero in the causal part, and one in key 2
        [0.0, 0.0, 0.0, 1.0],
    ])
    stats = row_statistics(w, torch.arange(4))
    assert stats["zeros"].tolist() == [0, 0, 2, 3]
    assert stats["support"].tolist() == [1, 2, 1, 1]
    assert math.isnan(stats["entropy"][0])  # one visible key: excluded
    assert stats["entropy"][1] == pytest.approx(1.0)
    d = map_diagnostics(w[None])
    assert d["sparsity"] == pytest.approx(5 / 10)
    assert d["support"] == pytest.approx(5 / 4)
    assert d["entropy"] == pytest.approx((1.0 + 0.0 + 0.0) / 3)


def test_signed_and_all_zero_rows():
    w = torch.tensor([
        [1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],  # an all-zero row (rectified, rela): entropy undefined, support 0
        [-0.5, 0.5, 0.0],  # signed: entropy of |w| normalised -> log 2 / log 3
    ])
    stats = row_statistics(w, torch.arange(3))
    assert math.isnan(stats["entropy"][1]) and stats["support"][1] == 0
    assert stats["entropy"][2] == pytest.approx(math.log(2) / math.log(3))
    assert stats["first"][2] == -0.5  # the sink weight stays signed
    all_zero = map_diagnostics(torch.zeros(1, 4, 4))
    assert math.isnan(all_zero["entropy"]) and all_zero["per_head"]["entropy"] == [[None]]
    assert all_zero["sparsity"] == 1.0


def test_sampled_rows_estimate_the_full_map_with_row_weights():
    torch.manual_seed(0)
    length = 200
    w = attention_weights("softmax", 3 * torch.randn(2, length, length))
    full = map_diagnostics(w)
    positions, row_weights = sample_rows(length, length, seed=0)
    assert map_diagnostics(w[:, positions], positions, row_weights) == full  # all rows: exact
    estimates = []
    for seed in range(20):
        positions, row_weights = sample_rows(length, 32, seed)
        estimates.append(map_diagnostics(w[:, positions], positions, row_weights))
    for key in ("entropy", "support"):
        mean = sum(e[key] for e in estimates) / len(estimates)
        assert mean == pytest.approx(full[key], rel=0.05)


@pytest.mark.parametrize("n_tokens,rows", [(1, 64), (10, 64), (64, 64), (65, 64), (1000, 64), (65_536, 64),
                                           (100, 1), (100, 7)])
def test_row_sampling_is_deterministic_and_within_bounds(n_tokens, rows):
    positions, weights = sample_rows(n_tokens, rows, seed=3)
    again, weights_again = sample_rows(n_tokens, rows, seed=3)
    assert torch.equal(positions, again) and torch.equal(weights, weights_again)
    assert len(positions) == min(n_tokens, rows)
    assert int(positions.min()) >= 0 and int(positions.max()) == n_tokens - 1  # the last row always
    assert len(set(positions.tolist())) == len(positions)
    assert float(weights.sum()) == n_tokens  # the rows stand for the whole sequence
    if n_tokens > rows:
        late = max(1, rows // 8)
        assert positions[-late:].tolist() == list(range(n_tokens - late, n_tokens))
        assert not torch.equal(positions, sample_rows(n_tokens, rows, seed=4)[0]) or rows <= late + 1


def test_real_lengths_stop_before_trailing_padding():
    ids = torch.tensor([[1, 5, 6, 0, 0], [1, 2, 3, 4, 5], [1, 0, 3, 0, 0]])
    assert real_lengths(ids).tolist() == [3, 5, 3]


def tiny_decoder(attn: str = "softmax", pe: str = "nape", **kwargs) -> Decoder:
    torch.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=12, d_model=16, n_layers=2, n_heads=4, ffn=32, attn=attn, pe=pe,
                               **kwargs))


def check_result(result: dict, n_layers: int = 2, n_heads: int = 4) -> None:
    for key in ("sparsity", "sink_rate", "sink_rate_0.2", "support"):
        assert math.isfinite(result[key]), key
    assert 0 <= result["sparsity"] <= 1 and 0 <= result["sink_rate"] <= result["sink_rate_0.2"] <= 1
    assert math.isnan(result["entropy"]) or -1e-6 <= result["entropy"] <= 1 + 1e-6
    assert result["diagnostic_rows"] >= 1
    assert set(result["per_head"]) == {"sparsity", "first_token_weight", "entropy", "support"}
    assert all(len(v) == n_layers and all(len(h) == n_heads for h in v) for v in result["per_head"].values())
    json.dumps(result["per_head"], allow_nan=False)


def test_measure_attention_on_a_tiny_decoder():
    model = tiny_decoder()
    ids = torch.randint(1, 12, (3, 300))
    ids[1, 250:] = 0  # padding: rows stay within the 250 real tokens
    result = measure_attention(model, ids, rows=16, seed=0)
    check_result(result)
    assert math.isfinite(result["entropy"])
    assert result["diagnostic_rows"] == 16
    assert measure_attention(model, ids, rows=16, seed=0) == result  # deterministic
    exact = measure_attention(model, ids[:, :40], rows=64)
    assert exact["diagnostic_rows"] == 40
    for layer in model.attention_layers:
        assert layer.query_chunk is None  # restored


def test_measure_attention_matches_the_dense_map_when_every_row_is_taken():
    model = tiny_decoder(pe="alibi")
    ids = torch.randint(1, 12, (1, 30))
    result = measure_attention(model, ids, rows=64)
    with torch.no_grad():
        states = model.hidden_states(ids)
        dense = torch.stack([layer.attention_map(x)[0] for layer, x in zip(model.attention_layers, states, strict=True)])
    assert result == map_diagnostics(dense) | {"diagnostic_rows": 30}


def test_measure_attention_with_features_and_under_autocast():
    model = tiny_decoder(has_features=True)
    ids = torch.randint(1, 12, (2, 20))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = measure_attention(model, ids.numpy(), torch.rand(2, 20), rows=8)
    check_result(result)


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_every_registered_mechanism(attn):
    """Every mechanism builds with its defaults (one that cannot fails here) and gives finite diagnostics."""
    model = tiny_decoder(attn=attn, pe="rope")
    result = measure_attention(model, torch.randint(1, 12, (1, 48)), rows=12)
    check_result(result)


def test_realised_tokens_bound_the_sampled_rows():
    model = tiny_decoder()
    ids = torch.randint(1, 12, (2, 60))
    short = measure_attention(model, ids, rows=64, realised_tokens=[20, 25])
    assert short["diagnostic_rows"] == 25
    assert short == measure_attention(model, ids[:, :25].clone().index_put_(
        (torch.tensor([0] * 5), torch.arange(20, 25)), torch.zeros(5, dtype=torch.long)), rows=64)
