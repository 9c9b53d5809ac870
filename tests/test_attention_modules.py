"""Every registered mechanism as a module, with every encoding: chunking, maps, gradients, training.

One parametrised test per property over ``ATTENTION.names()``: registering a mechanism adds its tests.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from lengthbench.models.attention import ATTENTION
from lengthbench.models.decoder import Decoder, ModelConfig
from lengthbench.models.positional import POSITIONAL_ENCODINGS, build_pe


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from threads, and on a loaded 2-core machine two threads per op made
    these tests ~15x slower (spinning workers); the previous setting comes back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

MECHANISMS = ATTENTION.names()
ENCODINGS = POSITIONAL_ENCODINGS.names()
SUM_TO_ONE = {"softmax", "gated", "ssmax", "assmax", "adatemp", "entmax", "sparsemax", "sentmax", "asentmax",
              "stickbreaking"}  # (Sieve's rows, Eq. 7: one less the stick its support leaves)


def build(name: str, pe: str = "nape", d_model: int = 16, n_heads: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    layer = ATTENTION.get(name)(d_model, n_heads, build_pe(pe, n_heads, d_model // n_heads))
    # Nudge every parameter off its start (zero projections, unit gains) so that all paths are exercised.
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return layer


def inputs(batch=2, tokens=7, d_model=16, seed=1):
    return torch.randn(batch, tokens, d_model, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pe", ENCODINGS)
@pytest.mark.parametrize("name", MECHANISMS)
def test_chunked_equals_unchunked(name, pe):
    layer = build(name, pe)
    x = inputs()
    full = layer(x)
    assert full.shape == x.shape and torch.isfinite(full).all()
    for chunk in (1, 3):
        layer.query_chunk = chunk
        torch.testing.assert_close(layer(x), full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MECHANISMS)
def test_attention_map_is_the_effective_map(name):
    """``attention_map`` rows are the weights the output is made of: heads == map @ v (before norms)."""
    layer = build(name, "alibi")
    x = inputs()
    q, k, v = layer.project(x)
    heads = layer.reference_attend(q, k, v, x)
    full = layer.attention_map(x)
    assert full.shape == (2, 2, 7, 7)
    torch.testing.assert_close(heads, full @ v, rtol=1e-5, atol=1e-6)
    rows = torch.tensor([0, 4, 6])
    torch.testing.assert_close(layer.attention_map(x, rows), full[:, :, rows])
    assert (full[..., torch.ones(7, 7, dtype=torch.bool).triu(1)] == 0).all()
    if name in SUM_TO_ONE:
        torch.testing.assert_close(full.sum(-1), torch.ones(2, 2, 7))


# Plain linear maps shared by every mechanism: their gradients are torch's; the input's covers the path.
SHARED_WEIGHTS = {"qkv.weight", "out.weight", "qk2.weight", "gate.weight"}


@pytest.mark.parametrize("name", MECHANISMS)
def test_gradcheck_float64(name):
    """Gradients of the layer with respect to its input and its mechanism's own parameters against finite
    differences, in float64."""
    layer = build(name, "nape", d_model=8, n_heads=2).double()
    x = inputs(batch=1, tokens=5, d_model=8).double().requires_grad_()
    own = {n: p.detach().clone().requires_grad_() for n, p in layer.named_parameters() if n not in SHARED_WEIGHTS}

    def run(x, *values):
        return functional_call(layer, dict(zip(own, values, strict=True)), (x,), strict=False)

    assert torch.autograd.gradcheck(run, (x, *own.values()), eps=1e-6, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("name", MECHANISMS)
def test_unknown_parameter_is_refused(name):
    with pytest.raises(ValueError, match="no_such_parameter"):
        ATTENTION.get(name)(16, 2, build_pe("none", 2, 8), no_such_parameter=1)


@pytest.mark.parametrize("name", MECHANISMS)
def test_length_one_and_long_rows(name):
    layer = build(name, "rope")
    assert torch.isfinite(layer(inputs(tokens=1))).all()
    layer.query_chunk = 16
    x = inputs(batch=1, tokens=300)
    out = layer(x)
    assert torch.isfinite(out).all()
    assert torch.isfinite(layer.attention_map(x, torch.tensor([0, 299]))).all()


def previous_token_task(batch=16, tokens=8, vocab=8, seed=0):
    """Predict the previous token of uniform random tokens. Without attention nothing beats the uniform
    guess (loss log 8 = 2.08), so a falling loss means the attention path learns."""
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(seed))
    return ids, ids.roll(1, dims=1)


@pytest.mark.parametrize("pe", ENCODINGS)
@pytest.mark.parametrize("name", MECHANISMS)
def test_tiny_decoder_trains(name, pe):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, ffn=32, attn=name, pe=pe)
    model = Decoder(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids, labels = previous_token_task()
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(ids)[:, 1:].reshape(-1, 8), labels[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses)))
    assert min(losses[-3:]) < 0.95 * losses[0], f"loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"


@pytest.mark.parametrize("name", MECHANISMS)
def test_reference_scores_stay_float32_under_autocast(name):
    """The references' raw scores are the fp32 product of q and k under bf16 autocast too (the runner's on
    CUDA), as the fused kernels' fp32 accumulators are: models that train on the references (``trains_dense``)
    and are scored on the kernels see the same scores. The bf16 product moves them by about 2^-9."""
    torch.manual_seed(0)
    layer = ATTENTION.get(name)(64, 4, build_pe("alibi", 4, 16))
    q, k = 3 * torch.randn(2, 4, 40, 16), 3 * torch.randn(2, 4, 40, 16)
    positions = torch.arange(40)
    exact = layer.scores(q, k, positions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = layer.scores(q, k, positions)
        coarse = torch.matmul(q, k.transpose(-1, -2))
    assert under.dtype == exact.dtype == torch.float32
    torch.testing.assert_close(under, exact, rtol=1e-6, atol=1e-5)
    assert coarse.dtype == torch.bfloat16  # what the scores were before
    assert (coarse.float() - torch.matmul(q, k.transpose(-1, -2))).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["stickbreaking", "sieve"])
def test_remainder_dropped_module(name):
    """``remainder="drop"``: the module's output is its map (nothing on the diagonal) times the values; Sieve's names
    its fused op (which computes both remainders), stick-breaking's none (a CUDA forward runs this reference); an
    unknown value is refused when the model is built."""
    torch.manual_seed(0)
    layer = ATTENTION.get(name)(16, 2, build_pe("none", 2, 8), remainder="drop")
    x = inputs()
    q, k, v = layer.project(x)
    full = layer.attention_map(x)
    assert (torch.diagonal(full, dim1=-2, dim2=-1) == 0).all() and (full[..., 0, :] == 0).all()
    torch.testing.assert_close(layer.reference_attend(q, k, v, x), full @ v)
    assert layer.kernel_names() == ((name,) if name == "sieve" else ())
    assert ATTENTION.get(name)(16, 2, build_pe("none", 2, 8)).kernel_names() == (name,)
    with pytest.raises(ValueError, match="remainder"):
        ATTENTION.get(name)(16, 2, build_pe("none", 2, 8), remainder="self")
