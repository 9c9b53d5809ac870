"""``Task`` and ``AttentionLayer`` are abstract base classes: a subclass that leaves out a method a subclass must
define fails where it is registered (its definition, under the decorator) and where it is created, with a
``TypeError`` that names the method; every registered task and mechanism defines them all."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from lengthbench.models.attention import AttentionLayer, causal_mask, register_attention
from lengthbench.models.attention.registry import MECHANISMS
from lengthbench.models.positional import build_pe
from lengthbench.tasks import TASKS, get_task, register_task, task_names
from lengthbench.tasks.base import IGNORE_INDEX, ModelDefaults, Task, full_batch, uniform_integers


class _Vocab(Task):
    """A task with its vocabulary and sizes but no ``generate``."""

    model_defaults = ModelDefaults(layers=1, d_model=16, heads=2, ffn=32, train_samples=100)

    def build_vocab(self):
        return ["<pad>", "a", "b"]

    def max_tokens(self, n):
        return n


@pytest.fixture
def registries(monkeypatch):
    """The task and mechanism registries as they are, restored after the test."""
    monkeypatch.setattr(TASKS, "_entries", dict(TASKS._entries))
    monkeypatch.setattr(MECHANISMS, "_entries", dict(MECHANISMS._entries))


def test_a_task_without_generate_fails_where_it_is_defined_and_where_it_is_created(registries):
    with pytest.raises(TypeError, match=r"task 'no-generate': NoGenerate does not define generate \(abstract"):
        @register_task("no-generate")
        class NoGenerate(_Vocab):
            pass
    assert "no-generate" not in task_names()
    with pytest.raises(TypeError, match="abstract.*generate"):
        _Vocab()

    @register_task("test-previous")
    class Previous(_Vocab):  # the same task with its generator: registered and run
        def generate(self, rng, n):
            input_ids = 1 + uniform_integers(rng, 0, n, 0, 2).astype(np.int64)
            labels = np.full_like(input_ids, IGNORE_INDEX)
            labels[:, 1:] = input_ids[:, :-1]
            return full_batch(input_ids, labels, n)

    batch = get_task("test-previous").batch(range(3), 5, "test", 0)
    assert batch.input_ids.shape == (3, 5) and (batch.labels[:, 1:] == batch.input_ids[:, :-1]).all()


def test_an_attention_layer_without_weights_fails_where_it_is_defined_and_where_it_is_created(registries):
    with pytest.raises(TypeError, match=r"attention mechanism 'no-weights': NoWeights does not define weights"):
        @register_attention("no-weights")
        class NoWeights(AttentionLayer):
            def finish_heads(self, heads, x):
                return 2 * heads
    assert "no-weights" not in MECHANISMS

    class Unregistered(AttentionLayer):
        pass

    with pytest.raises(TypeError, match="abstract.*weights"):
        Unregistered(16, 2, build_pe("none", 2, 8))

    @register_attention("test-uniform")
    class Uniform(AttentionLayer):  # with its weights: registered and run
        def weights(self, scores, query_positions, x_rows):
            visible = causal_mask(query_positions, scores.shape[-1]).to(scores.dtype)
            return visible.expand_as(scores) / visible.sum(-1, keepdim=True)

    import torch

    layer = Uniform(16, 2, build_pe("none", 2, 8))
    assert layer(torch.randn(2, 5, 16)).shape == (2, 5, 16)


@pytest.mark.parametrize("name", task_names())
def test_every_registered_task_defines_the_abstract_methods(name):
    assert not inspect.isabstract(TASKS.get(name))


@pytest.mark.parametrize("name", MECHANISMS.names())
def test_every_registered_mechanism_defines_the_abstract_methods(name):
    assert not inspect.isabstract(MECHANISMS.get(name).module)
