import math

import pytest
import torch

from lengthbench.models.positional import (
    POSITIONAL_ENCODINGS,
    alibi_slopes,
    build_pe,
    llama3_inverse_frequencies,
)


def test_alibi_slopes_follow_press_et_al():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2 ** -(i + 1) for i in range(8)], dtype=torch.float32))
    # 12 heads: the 8 power-of-two slopes, then every other slope of the 16-head sequence
    expected = [2 ** (-(i + 1)) for i in range(8)] + [2 ** (-(2 * i + 1) / 2) for i in range(4)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected, dtype=torch.float32))


def test_nape_is_half_nope_half_alibi_with_slope_one_over_h():
    slopes = build_pe("nape", 8, 16).slopes()
    assert slopes[:4].tolist() == [0, 0, 0, 0]
    assert torch.allclose(slopes[4:], torch.tensor([1, 1 / 2, 1 / 3, 1 / 4]))
    assert build_pe("nape", 1, 16).slopes().tolist() == [0.0]


def test_llama3_scaling_keeps_high_and_divides_low_frequencies():
    plain = llama3_inverse_frequencies(64, factor=1.0)
    scaled = llama3_inverse_frequencies(64, factor=16.0)
    wavelength = 2 * math.pi / plain
    high = wavelength < 8192 / 4
    low = wavelength > 8192
    assert torch.allclose(scaled[high], plain[high])
    assert torch.allclose(scaled[low], plain[low] / 16)
    assert low.any() and high.any()


def test_rope_scores_depend_only_on_relative_position():
    pe = build_pe("rope", 1, 16)
    q = torch.randn(1, 1, 1, 16).expand(1, 1, 40, 16)
    k = torch.randn(1, 1, 1, 16).expand(1, 1, 40, 16)
    qr, kr = pe.rotate(q, k, torch.arange(40))
    scores = (qr @ kr.transpose(-1, -2))[0, 0]
    assert torch.allclose(scores[10, 3], scores[30, 23], atol=1e-4)
    assert not torch.allclose(scores[10, 3], scores[10, 9], atol=1e-4)


@pytest.mark.parametrize("name", POSITIONAL_ENCODINGS.names())
def test_every_encoding_builds_and_keeps_shapes(name):
    pe = build_pe(name, 4, 8)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    qr, kr = pe.rotate(q, k, torch.arange(5))
    assert qr.shape == q.shape and kr.shape == k.shape
    slopes = pe.slopes()
    assert slopes is None or slopes.shape == (4,)


def test_nope_alias():
    assert POSITIONAL_ENCODINGS.canonical("nope") == "none"


@pytest.mark.parametrize("name", POSITIONAL_ENCODINGS.names())
@pytest.mark.parametrize("n_heads", [1, 4, 6])
def test_biased_heads_are_the_nonzero_slopes(name, n_heads):
    """``biased_heads`` (plain booleans, known on the meta device too) says what ``slopes`` says."""
    pe = build_pe(name, n_heads, 8)
    slopes = pe.slopes()
    expected = (False,) * n_heads if slopes is None else tuple((slopes != 0).tolist())
    assert pe.biased_heads() == expected
    with torch.device("meta"):
        assert build_pe(name, n_heads, 8).biased_heads() == expected
