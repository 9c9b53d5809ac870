"""Fused Triton attention kernels (``lengthbench.kernels``), one op per module.

The attention modules in ``lengthbench.models.attention`` ask :func:`get_kernel` for their op on CUDA
and fall back to their dense reference when it returns None (no CUDA, no Triton, or no kernel for the
mechanism). Every op has the signature::

    op(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, **mechanism_params) -> out

with ``q, k, v`` of shape ``[batch, heads, tokens, head_dim]`` (causal), ``slopes`` a ``[heads]`` tensor of
ALiBi slopes (score ``- slope_h * (r - j)``) or None, ``row_scale`` an optional ``[batch, heads, tokens]``
factor multiplying each query row's (biased) scores, ``sm_scale`` default ``1 / sqrt(head_dim)``, and
``out`` of the shape of ``q``. The one exception is ``tda``, which takes both views::

    op(q1, k1, q2, k2, v, *, lam, slopes=None, row_scale=None, sm_scale=None, **mechanism_params) -> out

The positional tensors are cast to the dtype of the last one (``v``): under bf16 autocast, normalised or
rotated queries and keys come out in fp32 while ``v`` is bf16.

This package imports neither ``lengthbench.models`` nor the harness.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable

# mechanism name -> "module:function" inside this package. Extra parameters: entmax ``alpha`` (1.5 or 2),
# sieve ``alpha`` (1.5 only), sieve-window ``eps``, softpick ``eps``, tra ``beta``/``kappa``/``power`` (unit q, k and
# ``sm_scale=1`` from the module), tda those of tra plus ``lam``. All ops give gradients to q, k, v, ``row_scale`` and ``slopes`` (and
# tra's and tda's ``beta``, tda's ``lam``).
_KERNELS: dict[str, str] = {
    "stickbreaking": "stickbreaking:stickbreaking_attention",
    "sieve": "sieve:sieve_attention",
    "sieve-window": "sieve:sieve_alg1_attention",
    "entmax": "entmax:entmax_attention",
    "sparsemax": "entmax:sparsemax_attention",
    "adatemp": "adatemp:adatemp_attention",
    "softpick": "softpick:softpick_attention",
    "rectified": "rectified:rectified_attention",
    "rela": "rela:rela_attention",
    "tra": "tra:tra_attention",
    "tda": "tda:tda_attention",
}


def triton_available() -> bool:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


# The launch settings under which an op decides nothing on the host from its data (no host sync, no launch sized by a
# count on the device), so that a CUDA graph can record it (the training step of lengthbench/graph_step.py): entmax's
# threshold in one kernel and its output over all keys (no candidate lists, no gathered open rows), TDA without its
# activity map, its forward on tiles of 32 rows (three programs a head at 91 tokens: the batch's thousands of short
# heads fill the GPU) and its backward on 64 x 32, and the pointwise ops of ``_rowwise.py`` (softpick, TRA) on tiles
# of 64 query rows x 32 keys forward and 32 x 32 backward (``ROWWISE_CAPTURE``) rather than the 128 x 64 and 64 x 64
# they take at every other width (``_rowwise.launch_settings``). Those tiles against the others, ratios to softmax +
# RoPE's samples/s at batch 128 (paper models, H200, 2026-11-28, commit 77e1f96, ``benchmarks/gpu_checks.sh ab``,
# results/benchmarks/gpu_logs/ab_rowwise_capture_tiles.txt): MQMTAR softpick 0.85 -> 0.90; Copy softpick 0.86 -> 0.93
# (RoPE) and 0.80 -> 0.93 (NAPE), TRA 1.00 -> 1.02 and 0.93 -> 0.95. TDA's backward there without its dq kernel
# (``fused_bwd``: the dk/dv kernel adds dq and the per-row gradients atomically), against the two kernels, same
# measure (H200, 2026-11-28, commit 4f94b3d, results/benchmarks/gpu_logs/ab_fused_backward.txt), RoPE / NAPE: MQMTAR
# 0.66 -> 0.67 / 0.67 -> 0.69, MQRAR 0.73 -> 0.73 / 0.74 -> 0.76, Copy 0.73 -> 0.75 / 0.73 -> 0.76. That dk/dv kernel
# on 64 query rows x 32 keys rather than 32 x 32 (each key tile's program takes its query rows 64 at a time), same
# measure with RoPE (H200, 2026-11-28, commit b032cf2, results/benchmarks/gpu_logs/ab_tda_dkdv_tiles.txt): MQMTAR 0.78
# -> 0.79, Copy 0.84 -> 0.89; the forward on 64 x 32 as well left MQMTAR at 0.79. Where a head's rows fit 128
# (MQMTAR, MQRAR), its backward in one program a head (``rows``: no atomics, no zeroed buffer, no casts after), same
# measure with RoPE (H200, 2026-11-28, commit 157f4e4, results/benchmarks/gpu_logs/ab_tda_whole_rows.txt): MQMTAR 0.79
# -> 0.80, MQRAR 0.84 -> 0.88 ([128, 32, 4]; 8 warps 0.78 and 0.82, key tiles of 64 0.80 and 0.85); Copy's 131 rows
# on [256, 32, 8] 0.91 -> 0.80, so they keep the dk/dv kernel.
ROWWISE_CAPTURE = {"fwd": (64, 32, 4), "bwd": (32, 32, 4)}
CAPTURE_TUNING: dict[str, dict] = {
    "entmax": {"lists": False, "split": False},
    "sparsemax": {"lists": False, "split": False},
    "sieve": {"lists": False, "split": False},
    "tda": {"map": 0, "fwd": (32, 32, 4), "dq": (32, 32, 4), "dkdv": (64, 32, 4), "fused_bwd": True,
            "rows": (128, 32, 4)},
    "softpick": dict(ROWWISE_CAPTURE),
    "tra": dict(ROWWISE_CAPTURE),
}
# The stick-breaking family's capturable ops: the long-context ones (``stickbreaking.py``, ``sieve.py``) at every width
# (``wide``, the default), or the training-width kernels of ``narrow.py`` up to 128 keys (``narrow``;
# ``LENGTHBENCH_CAPTURE_STICK=narrow``, for benchmarks that compare the two). Training throughput at batch 128 over
# softmax + RoPE's, the two side by side (paper models, H200, 2026-11-27, commit 4c5348a, 32-tiles,
# results/benchmarks/train_throughput.md, where sieve-window at eps 8 is "sieve" and at eps 2 "sieve-alg1"): MQRAR
# sieve-window (eps 8) 0.76 / 0.63, stick-breaking 0.83 / 0.69; MQMTAR sieve-window (eps 8) 0.78 / 0.77,
# stick-breaking 0.83 / 0.79; Copy sieve-window (eps 8) 0.70 / 0.65, stick-breaking 0.78 / 0.75. ``wide``'s tiles: 64
# query rows and 32 keys, forward and backward, and stick-breaking's forward on its full tiles (``STICK_CAPTURE``);
# over 32 rows and 32 keys, same machine and commit (d93ab1b, gpu_logs/train_tiles_sweep.txt): Copy stick-breaking
# 0.77 -> 0.86, sieve-window (eps 2) 0.70 -> 0.80; MQRAR stick-breaking 0.83 -> 0.87, sieve-window (eps 8) 0.77 ->
# 0.82, (eps 2) 0.77 -> 0.83.
STICK_FAMILY = ("stickbreaking", "sieve-window")
# the mechanisms that take the long-context op at every width under ``wide``
WIDE_CAPTURE = (*STICK_FAMILY, "sieve")
# The training step takes the long-context op's tiles, registers and one-bf16 sums (``stickbreaking.launch_config``'s
# defaults: 64 query rows and 32 keys, the registers capped at 128 a thread in the forward up to head dim 64 and at 168
# in the backward up to 32) and keeps the causal masks on every tile of Sieve's Algorithm 1 window, the forward's
# loads in turn and the value loads of sieve-window's key tiles without a kept key skipped. Through whole training
# steps on Copy at batch 512 (head dim 16), ratios to softmax + RoPE's samples/s, the step before (64 x 32 tiles
# without a register cap, two-bf16 sums) -> one-bf16 sums -> one-bf16 sums and the capped registers: Sieve 0.81 ->
# 0.80 -> 0.88, stick-breaking 0.95 -> 0.94 -> 0.97, sieve-window (eps 8) 0.85 -> 0.86 -> 0.89, (eps 2) 0.86 -> 0.87
# -> 0.90 (H200, 2026-11-29, commit 10adcaa, results/benchmarks/gpu_logs/stick_capture_registers.txt, where Sieve is
# "sieve-entmax" and sieve-window "sieve" and "sieve-alg1"). The loads ahead in Sieve's walk, same measure: 0.78
# against 0.81 (commit 8e537ab, results/benchmarks/gpu_logs/entmax_threshold_unseen_keys.txt).
STICK_CAPTURE = {"cumsum": "bf16", "full_tiles": False, "prefetch": False, "skip_empty": True}


def _env_choice(variable: str, default: str, *others: str) -> str:
    """The environment's ``variable``: ``default`` where unset, else ``default`` or one of ``others`` (a
    ``ValueError`` that names them)."""
    value = os.environ.get(variable, default)
    choices = (default, *others)
    if value not in choices:
        raise ValueError(f"{variable} must be {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}")
    return value


# Where the modules that call a fused op (:func:`get_kernel`) take their query, key and value views on CUDA: "op"
# (``views.py``: RoPE, the norms of TDA's and TRA's cosine scores, and the copies to [B, H, T, D] in one custom op each
# way) or "compiled" (the model's own prologue, left to Inductor in the training step); env ``LENGTHBENCH_VIEWS``, for
# benchmarks that compare the two. Through whole training steps at batch 128 with RoPE, ratios to softmax + RoPE's
# samples/s, the compiled prologue (train_throughput.md's cells before) -> the op (H200, 2026-11-28, commit 110dac9,
# results/benchmarks/gpu_logs/views_all_mechanisms.txt), MQMTAR / MQRAR / Copy: entmax 0.86 / 0.87 / 0.82 -> 0.91 /
# 0.92 / 0.86, ASEntmax 0.79 / 0.80 / 0.75 -> 0.83 / 0.85 / 0.79, stick-breaking 0.89 / 0.88 / 0.88 -> 0.94 / 0.92 /
# 0.91, sieve-window (eps 8; "sieve" there) 0.83 / 0.83 / 0.81 -> 0.88 / 0.86 / 0.84, Sieve ("sieve-entmax") 0.72 /
# 0.67 / 0.64 -> 0.76 / 0.69 / 0.66, TRA 0.89 / 0.99 / 1.02 -> 1.01 / 1.09 / 1.11. TDA's unit views, op / compiled, RoPE and NAPE: MQMTAR 0.77 / 0.67 and
# 0.77 / 0.65, MQRAR 0.72 / 0.72 and 0.81 / 0.71, Copy 0.83 / 0.73 and 0.82 / 0.70 (commit ac1ca07,
# results/benchmarks/gpu_logs/ab_unit_views.txt).
VIEWS = _env_choice("LENGTHBENCH_VIEWS", "op", "compiled")


def views_op() -> Callable | None:
    """``views.fused_views`` where the modules take it (:data:`VIEWS`) and Triton runs, else None."""
    if VIEWS != "op" or not triton_available():
        return None
    from lengthbench.kernels.views import fused_views

    return fused_views


def takes_views(ops) -> bool:
    """Whether a model whose modules name the fused ops ``ops`` (their ``kernel_names``) takes :data:`VIEWS`' path:
    where one of them is an op of this package (softmax's name is SDPA's)."""
    return bool(set(ops) & set(_KERNELS))


# Sieve (Section 3's form, ``sieve``) under ``wide``: its threshold found with every row's keys in registers
# (``narrow.sieve_threshold``, up to 256 keys), then the long-context op's filtered walk on the stick-breaking capture
# tiles, at every width; under ``narrow``, the training-width kernels up to 128 keys and past them the threshold
# search of ``_entmax_search.py`` before the op's own walk. Ratios to softmax + RoPE's samples/s at batch 128 with
# RoPE, the training-width kernels (train_throughput.md's cells at commit 110dac9) -> this path (H200, 2026-11-28,
# commit cfafbf4, results/benchmarks/gpu_logs/sieve_entmax_threshold_tda_fill.txt, where Sieve is "sieve-entmax"):
# MQMTAR 0.76 -> 0.85, MQRAR 0.69 -> 0.82, Copy 0.66 -> 0.77; at batch 512 MQMTAR 0.71 -> 0.81, MQRAR 0.62 -> 0.78.
# Other walk tiles on Copy, same
# measure (H200, 2026-11-28, commit 9ef32c8, results/benchmarks/gpu_logs/ab_sdpa_backend_inductor_walk.txt): 64 x 32
# (these) 0.77, 32 x 32 0.69, a forward of 64 x 64 0.75, 3 stages 0.77.
SIEVE_ENTMAX_CAPTURE = {"lists": False, "split": False, "threshold": "narrow", "walk": dict(STICK_CAPTURE)}
CAPTURE_STICK = _env_choice("LENGTHBENCH_CAPTURE_STICK", "wide", "narrow")
if CAPTURE_STICK == "wide":
    for _name in STICK_FAMILY:
        CAPTURE_TUNING[_name] = dict(STICK_CAPTURE)
    CAPTURE_TUNING["stickbreaking"]["full_tiles"] = True  # (the filter of Sieve's ops keeps the masks)
    CAPTURE_TUNING["sieve"] = dict(SIEVE_ENTMAX_CAPTURE)

# 1.5-entmax's backward at the training widths (``kernels/narrow.py``, its ``entmax_backward`` tuning key):
# ``narrow`` (a row block a program against all keys), ``rowwise`` (the forward also keeps ``sum s``, ``sum s^2``
# and ``sum s v`` a row, and the dq and dk/dv kernels of ``_rowwise.py`` run on them, key tiles against query
# tiles as in FlashAttention's backward) or ``auto``: ``rowwise`` where there is a row scale (ASEntmax,
# SSMax-scaled entmax) and the rows are :data:`ROWWISE_FROM` keys or wider, else ``narrow``. Through whole training
# steps on an H200 at batch 128, ratios to softmax + RoPE's samples/s, narrow -> rowwise
# (results/benchmarks/gpu_logs/ab_entmax_backward.txt): ASEntmax on Copy (131 tokens) 0.58 -> 0.65 (RoPE) and
# 0.57 -> 0.64 (NAPE), on MQRAR (83) 0.76 -> 0.71, on MQMTAR (91) 0.76 -> 0.75; plain entmax on Copy 0.68 -> 0.69,
# on MQMTAR 0.85 -> 0.83. (Measured while the narrow kernels took Copy's rows 128-130 against 256 keys.) With their
# two tiles of 128 + 16 keys (``narrow._row_ranges``), ASEntmax on Copy, rowwise -> narrow, same measure (H200,
# 2026-11-29, commit 8e537ab, results/benchmarks/gpu_logs/entmax_threshold_unseen_keys.txt): batch 128 0.86 -> 0.85
# (RoPE and NAPE), batch 512 0.84 -> 0.83.
ENTMAX_BACKWARD = "auto"
ROWWISE_FROM = 129
# The ``rowwise`` backward without its dq kernel (``narrow.py``'s tuning key ``rowwise_fused``): the dk/dv kernel adds
# each (query tile, key tile) pair's share of dq and of the per-row gradients atomically (``_rowwise.fused_backward``),
# so the scores and their gradients are computed once instead of twice. Through whole training steps, ASEntmax on
# Copy at batch 128 (rows of 131 keys: the rowwise backward), ratios to softmax + RoPE's samples/s, two kernels ->
# fused: RoPE 0.74 -> 0.75, NAPE 0.75 -> 0.77 (H200, 2026-11-28, commit 4f94b3d,
# results/benchmarks/gpu_logs/ab_fused_backward.txt).
ROWWISE_FUSED = True
ROW_SCALED_ENTMAX = ("asentmax", "sentmax")


def entmax_backward_setting(mode: str = ENTMAX_BACKWARD) -> str:
    """The rule as a benchmark row records it: ``narrow``, ``rowwise`` or ``auto:<ROWWISE_FROM>``."""
    return f"auto:{ROWWISE_FROM}" if mode == "auto" else mode


def entmax_backward_taken(setting: str, row_scale: bool, tokens: int) -> str:
    """``narrow`` or ``rowwise``: the backward that ``setting`` (:func:`entmax_backward_setting`'s form; ``auto``
    without a bound: every width) gives rows of ``tokens`` keys, with or without a row scale."""
    mode, _, start = str(setting).partition(":")
    if mode == "auto":
        return "rowwise" if row_scale and tokens >= int(start or 0) else "narrow"
    if mode not in ("narrow", "rowwise"):
        raise ValueError(f"entmax_backward must be auto, narrow or rowwise, got {mode!r}")
    return mode


def capture_tuning_overrides(text: str) -> dict[str, dict]:
    """``LENGTHBENCH_CAPTURE_TUNING``: a JSON object of mechanism -> tuning keys that replace or join that
    mechanism's :data:`CAPTURE_TUNING` (the long-context op's levers, e.g. ``{"sieve-window": {"rowmax_pass":
    "kernel"}}``; the training-width kernels of ``narrow.py`` take ``LENGTHBENCH_NARROW_TUNING``). A
    ``ValueError`` names what is wrong; the op itself checks its keys when it runs."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"LENGTHBENCH_CAPTURE_TUNING is not JSON ({error.msg}): {text!r}") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError("LENGTHBENCH_CAPTURE_TUNING must be a JSON object of mechanism -> object of tuning keys, "
                         f"got {text!r}")
    unknown = sorted(set(value) - set(_KERNELS))
    if unknown:
        raise ValueError(f"LENGTHBENCH_CAPTURE_TUNING names no fused op: {', '.join(unknown)} "
                         f"(choose from {', '.join(sorted(_KERNELS))})")
    # JSON lists stand for the tuples of tile settings
    return {name: {key: tuple(v) if isinstance(v, list) else v for key, v in tuning.items()}
            for name, tuning in value.items()}


# ``LENGTHBENCH_CAPTURE_TUNING`` changes some of them, for benchmarks that compare a lever through whole training steps
for _name, _tuning in capture_tuning_overrides(os.environ.get("LENGTHBENCH_CAPTURE_TUNING") or "{}").items():
    CAPTURE_TUNING[_name] = {**CAPTURE_TUNING.get(_name, {}), **_tuning}


def in_graph_set(text: str) -> frozenset[str]:
    """The mechanisms named by ``LENGTHBENCH_IN_GRAPH``: ``all``, ``none`` or names separated by commas."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    if names == {"all"}:
        return frozenset(_KERNELS)
    if names in ({"none"}, set()):
        return frozenset()
    unknown = names - set(_KERNELS)
    if unknown:
        raise ValueError(f"LENGTHBENCH_IN_GRAPH names no fused op: {', '.join(sorted(unknown))} "
                         f"(all, none, or some of {', '.join(sorted(_KERNELS))})")
    return frozenset(names)


# The ops that the recorded training step calls as nodes of its compiled graph (``_bridge.py``) rather than as
# graph breaks: every one. With them in the graph against breaks, ratios to softmax + RoPE at batch 128 (paper
# models, H200, 2026-11-27, commit fd78615, benchmarks/train_throughput.py --in-graph all / none side by side):
# MQMTAR stick-breaking 0.80 / 0.75, ASEntmax 0.77 / 0.72, TRA 0.89 / 0.78, TDA 0.66 / 0.51; MQRAR sieve-window
# (eps 8; "sieve" there) 0.64 / 0.61, TDA 0.70 / 0.56; Copy ASEntmax 0.60 / 0.55 (no op slower in the graph).
IN_GRAPH: frozenset[str] = frozenset(_KERNELS)
# ``LENGTHBENCH_IN_GRAPH`` sets it instead, for benchmarks that compare the two paths: ``all``, ``none`` or a
# comma-separated list of mechanisms
_in_graph_env = os.environ.get("LENGTHBENCH_IN_GRAPH")
if _in_graph_env is not None:
    IN_GRAPH = in_graph_set(_in_graph_env)


def has_kernel(mechanism: str) -> bool:
    """Whether :func:`get_kernel` gives ``mechanism`` an op here, decided without loading it: a forward that
    torch.compile traces may ask (``importlib`` in :func:`load_op` would break its graph; in ASEntmax's training step
    the compile failed on it)."""
    return mechanism in _KERNELS and triton_available()


def get_kernel(mechanism: str, capturable: bool = False, in_graph: bool = False) -> Callable | None:
    """The fused op of ``mechanism``, or None where it cannot run here (no CUDA, no Triton, or no kernel for
    the mechanism). ``capturable``: the op with the launch settings a CUDA graph can record
    (:data:`CAPTURE_TUNING`); ``in_graph``: for the mechanisms of :data:`IN_GRAPH`, as a node of a compiled
    graph rather than a graph break where autograd records the call (``_bridge.py``)."""
    if not has_kernel(mechanism):
        return None
    if in_graph and mechanism in IN_GRAPH:
        from lengthbench.kernels._bridge import bridged

        return bridged(mechanism, capturable)
    return load_op(mechanism, capturable)


@functools.cache
def load_op(mechanism: str, capturable: bool = False) -> Callable:
    """The fused op of ``mechanism`` wherever Triton imports (on a CPU, under ``TRITON_INTERPRET=1``), without
    the CUDA check of :func:`get_kernel`; a ``KeyError`` for a mechanism without one."""
    import torch

    module_name, function_name = _KERNELS[mechanism].split(":")
    module = importlib.import_module(f"lengthbench.kernels.{module_name}")
    op = getattr(module, function_name)
    if capturable and mechanism in CAPTURE_TUNING:
        op = functools.partial(op, tuning=CAPTURE_TUNING[mechanism])
    if capturable and mechanism in NARROW_OPS and not (mechanism in WIDE_CAPTURE and CAPTURE_STICK == "wide"):
        op = _narrow_or(mechanism, op)
    # torch.compile must not trace into the Triton launches (Inductor re-types their constants);
    # a graph break keeps the op an opaque autograd function inside compiled models.
    return torch.compiler.disable(_same_dtype(op))


# The training-width ops (``narrow.py``, every row's keys in registers): taken on the capturable path by 1.5-entmax
# (and by the stick-breaking family, Sieve among it, under ``LENGTHBENCH_CAPTURE_STICK=narrow``)
# where the rows are at most ``narrow.CAPTURE_MAX_TOKENS`` wide (256 keys for entmax, 128 for the stick-breaking
# family; fewer under ``LENGTHBENCH_NARROW_TUNING``'s ``max_tokens``, ``narrow.capture_max_tokens``) and the parameters
# are theirs (alpha 1.5, Sieve's masked weights); the op of ``_KERNELS`` elsewhere.
NARROW_OPS: dict[str, str] = {
    "stickbreaking": "narrow_stickbreaking",
    "sieve": "narrow_sieve_entmax",
    "sieve-window": "narrow_sieve_alg1",
    "entmax": "narrow_entmax",
}


def _narrow_or(mechanism: str, wide: Callable) -> Callable:
    """``mechanism``'s training-width op where the call fits it, else ``wide``."""
    from lengthbench.kernels import narrow

    op = getattr(narrow, NARROW_OPS[mechanism])
    widest = narrow.capture_max_tokens(mechanism)

    @functools.wraps(wide)
    def call(*tensors, **kwargs):
        fits = (tensors[0].shape[-2] <= widest and float(kwargs.get("alpha", 1.5)) == 1.5
                and kwargs.get("masked", True))
        return op(*tensors, **kwargs) if fits else wide(*tensors, **kwargs)

    return call


def _same_dtype(op: Callable) -> Callable:
    """``op`` with its positional tensors cast to the dtype of the last one."""

    @functools.wraps(op)
    def call(*tensors, **kwargs):
        dtype = tensors[-1].dtype
        return op(*(t if t.dtype == dtype else t.to(dtype) for t in tensors), **kwargs)

    return call


def kernel_names() -> list[str]:
    return sorted(_KERNELS)
