"""The registry of attention mechanisms (``--attn``): one entry per mechanism, its module, its weights and its
fused op.

A mechanism is registered once, on its module, with its dense weight function and, where it has one, its fused op
(the op itself, or its import path so that registering needs no Triton)::

    @register_attention("softpick", weights=softpick_weights,
                        kernel="lengthbench.kernels.softpick:softpick_attention")
    class SoftpickAttention(AttentionLayer): ...

That one registration makes it a choice of the decoder (``ATTENTION``, ``lengthbench run --attn``), gives
``attention_weights`` (``WEIGHT_FUNCTIONS``) its reference, the map every kernel is tested against, and its module
its op on CUDA (``KERNELS``, :func:`get_kernel`); the kernel tests take their cases from ``KERNELS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from lengthbench.models.attention.base import AttentionLayer, WeightFunction, causal_mask
from lengthbench.models.registry import Registry, UnknownNameError

T = TypeVar("T")


@dataclass(frozen=True)
class Mechanism:
    """A registered attention mechanism: its module (for the decoder), its dense weight function and its fused
    op."""

    name: str
    module: type[AttentionLayer]
    weights: WeightFunction | None  # None: a plugin's probe without a dense reference (no attention_weights)
    kernel: str | Callable | None = None  # the fused op or its path "package.module:function"; None: none


MECHANISMS: Registry[Mechanism] = Registry("attention mechanism")


class _Part(Generic[T]):
    """One part of the mechanisms (their modules or their weight functions), read like a registry of its own:
    the mechanisms that have that part."""

    def __init__(self, part: str):
        self._part = part

    def canonical(self, name: str) -> str:
        name = MECHANISMS.canonical(name)
        if getattr(MECHANISMS.get(name), self._part) is None:
            what = "a weight function" if self._part == "weights" else f"a {self._part}"
            raise UnknownNameError(f"attention mechanism {name!r} was registered without {what}; "
                                   f"those with one: {', '.join(self.names())}")
        return name

    def get(self, name: str) -> T:
        return getattr(MECHANISMS.get(self.canonical(name)), self._part)

    def names(self) -> list[str]:
        return [name for name in MECHANISMS if getattr(MECHANISMS.get(name), self._part) is not None]

    def __contains__(self, name: str) -> bool:
        return name in MECHANISMS and getattr(MECHANISMS.get(name), self._part) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def register(self, name: str, **_):
        raise TypeError(f"register {name!r} once, on its module: @register_attention({name!r}, weights=its_weight_fn) "
                        "gives both its module and its weight function")


ATTENTION: _Part[type[AttentionLayer]] = _Part("module")
WEIGHT_FUNCTIONS: _Part[WeightFunction] = _Part("weights")
KERNELS: _Part[str | Callable] = _Part("kernel")
# mechanism -> its fused op (or path), for the lookups of a forward that torch.compile traces (a plain dict)
_KERNEL_OF: dict[str, str | Callable] = {}


def register_attention(name: str, *, weights: WeightFunction | None = None, kernel: str | Callable | None = None,
                       aliases: tuple[str, ...] = (), replace: bool = False
                       ) -> Callable[[type[AttentionLayer]], type[AttentionLayer]]:
    """Class decorator registering an :class:`AttentionLayer` subclass under ``name`` with ``weights``, its
    dense weight function ``fn(scores, mask, **params)`` (see ``base.py``), and ``kernel``, its fused op: a
    function of the signature that ``lengthbench.kernels`` describes, or its import path
    ``"package.module:function"`` (loaded where the op first runs). Every mechanism of the package gives weights; a
    plugin's probe may leave them out (then ``attention_weights`` does not know the name). A mechanism without a
    kernel runs its dense reference everywhere."""
    if weights is not None and not callable(weights):
        raise TypeError(f"attention mechanism {name!r}: weights must be its weight function, got {weights!r}")
    if kernel is not None and not (callable(kernel) or (isinstance(kernel, str) and kernel.count(":") == 1)):
        raise TypeError(f"attention mechanism {name!r}: kernel must be its fused op or its path "
                        f"'package.module:function', got {kernel!r}")

    def decorator(cls: type[AttentionLayer]) -> type[AttentionLayer]:
        if not (isinstance(cls, type) and issubclass(cls, AttentionLayer)):
            raise TypeError(f"attention mechanism {name!r}: {cls!r} is not an AttentionLayer subclass")
        missing = sorted(cls.__abstractmethods__)
        if missing:
            raise TypeError(f"attention mechanism {name!r}: {cls.__name__} does not define {', '.join(missing)} "
                            "(abstract methods of AttentionLayer)")
        MECHANISMS.register(name, aliases=aliases, replace=replace)(Mechanism(name, cls, weights, kernel))
        _KERNEL_OF.pop(name, None)
        if kernel is not None:
            _KERNEL_OF[name] = kernel
        cls.name = name
        return cls

    return decorator


def attention_weights(name: str, scores: torch.Tensor, **params) -> torch.Tensor:
    """The dense causal weight map of mechanism ``name`` for raw scores ``[..., L, L]``.

    Row ``r`` is the query at position ``r``; entries ``j > r`` are exactly zero. Parameters take the
    defaults of ``../shared/specs/ATTENTION.md``. This is the reference every kernel is tested against.

    Parameters without a default: ``head_dim`` for ``tra`` and ``tda`` (whose ``scores`` are cosine
    scores), ``scores2`` (the second view's scores, same shape) for ``tda`` and ``diffsoftmax``. Learned
    parameters may be tensors: per head ``[H]`` (``s`` of ssmax and scalable-softpick, ``beta``/``gamma`` of
    sentmax) or per query row ``[..., L]`` (``beta``/``gamma`` of assmax and asentmax). Computed in float32,
    or float64 for float64 scores.
    """
    fn = WEIGHT_FUNCTIONS.get(name)
    length = scores.shape[-1]
    if scores.shape[-2] != length:
        raise ValueError(f"scores must be square [..., L, L], got {tuple(scores.shape)}")
    mask = causal_mask(torch.arange(length, device=scores.device), length)
    return fn(scores, mask, **params)


def kernel_names() -> list[str]:
    """The mechanisms registered with a fused op, sorted."""
    return sorted(KERNELS.names())


def has_kernel(name: str) -> bool:
    """Whether :func:`get_kernel` gives ``name`` an op here, decided without loading it (a forward that
    torch.compile traces may ask: an import would break its graph)."""
    from lengthbench.kernels import triton_available

    return name in _KERNEL_OF and triton_available()


def get_kernel(name: str, tuning: dict | None = None, in_graph: bool = False) -> Callable | None:
    """The fused op of mechanism ``name`` ready to call on CUDA (``lengthbench.kernels.get_op``: ``tuning`` its
    launch settings, ``in_graph`` a node of a compiled graph), or None where it has none or cannot run here."""
    if not has_kernel(name):
        return None
    from lengthbench.kernels import get_op

    return get_op(_KERNEL_OF[name], tuning, in_graph)


def load_kernel(name: str, tuning: dict | None = None) -> Callable:
    """The fused op of mechanism ``name`` wherever Triton imports (on a CPU under ``TRITON_INTERPRET=1``), without
    the CUDA check (``lengthbench.kernels.load_op``); a ``KeyError`` for a mechanism without one."""
    from lengthbench.kernels import load_op

    return load_op(_KERNEL_OF[name], tuning)
