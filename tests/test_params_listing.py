"""``lengthbench attn params`` / ``pe params``: what they list is what the constructors take, with a note each."""

from __future__ import annotations

import pytest
from cli_helpers import cli

from lengthbench.cli.registry import PARAM_NOTES, constructor_params
from lengthbench.models.attention import ATTENTION
from lengthbench.models.attention.base import AttentionLayer
from lengthbench.models.positional import POSITIONAL_ENCODINGS, PositionalEncoding, build_pe


@pytest.mark.parametrize("name", ATTENTION.names())
def test_attn_params_are_accepted_and_explained(name):
    params = constructor_params(ATTENTION.get(name), AttentionLayer)
    for key, default in params.items():
        # each listed key, given at its default, builds the mechanism (under NAPE, which every mechanism takes)
        ATTENTION.get(name)(16, 2, build_pe("nape", 2, 8), **{key: default})
        assert PARAM_NOTES.get(f"{name}.{key}", PARAM_NOTES.get(key)), f"{name}: no note for {key}"
    with pytest.raises(ValueError, match="takes no parameter"):
        ATTENTION.get(name)(16, 2, build_pe("nape", 2, 8), not_a_parameter=1)


def test_listing_finds_the_inherited_ones():
    assert set(constructor_params(ATTENTION.get("asentmax"), AttentionLayer)) == {
        "alpha", "delta", "gamma_scale", "scaled_heads"}
    assert set(constructor_params(ATTENTION.get("ssmax"), AttentionLayer)) == {"s_init", "log_offset", "scaled_heads"}
    assert constructor_params(ATTENTION.get("softmax"), AttentionLayer) == {}


@pytest.mark.parametrize("name", POSITIONAL_ENCODINGS.names())
def test_pe_params_are_accepted_and_explained(name):
    for key, default in constructor_params(POSITIONAL_ENCODINGS.get(name), PositionalEncoding).items():
        build_pe(name, 2, 8, **{key: default})
        assert PARAM_NOTES.get(key), f"{name}: no note for {key}"


def test_cli(monkeypatch, capsys):
    assert cli(monkeypatch, "attn", "params", "ssmax") == 0
    assert "scaled_heads" in capsys.readouterr().out
    assert cli(monkeypatch, "pe", "params", "rope") == 0
    assert "original_context" in capsys.readouterr().out
    assert cli(monkeypatch, "attn", "params", "nope") == 2
    assert "unknown attention 'nope'" in capsys.readouterr().err
    assert cli(monkeypatch, "pe", "params", "nope") == 2
