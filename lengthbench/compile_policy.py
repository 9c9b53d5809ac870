"""Which training steps run in one CUDA graph, which are compiled, on which attention path and with which launch
settings of the fused ops (:data:`CAPTURE_TUNING`), and the portable compilation cache.

On CUDA the training step runs in one CUDA graph by default (``train_step = "graph-compiled"`` or ``"graph"``,
:func:`trains_in_graph`, ``lengthbench/graph_step.py``). With ``train_step = "compiled"`` a model whose
attention calls no fused Triton op is compiled (``torch.compile``, CUDA graphs with ``compile_mode =
"reduce-overhead"``). A model that calls fused ops trains eagerly on them, or, with
``train_attention = "reference"``, on the mechanisms' dense references, compiled, where its training batches are
narrow (:func:`trains_dense`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from lengthbench.config import RunConfig
from lengthbench.devices import device_description
from lengthbench.store import atomic_write

# A folder of portable compilation caches (torch.compiler.save_cache_artifacts): a compiled run on a fresh machine
# loads its model's file and skips Inductor's code generation and Triton's kernel builds (on the H100 the dense
# references took 148 s to compile), and writes the file where it was missing.
COMPILE_CACHE_ENV = "LENGTHBENCH_COMPILE_CACHE"
# what the compiled graphs depend on (a seed, learning rate or sample count does not change them)
_GRAPH_FIELDS = ("task", "task_params", "attn", "attn_params", "pe", "pe_params", "train_length", "d_model",
                 "n_layers", "n_heads", "ffn", "batch_size", "compile_mode", "arch")


@functools.lru_cache(maxsize=1)
def model_source_digest() -> str:
    """A digest of the code the compiled step traces (the models' modules and both training steps): a cache file
    written by other code is another file, not a stale one that shadows the new graphs (a changed formula under
    an unchanged configuration)."""
    import lengthbench.models as models

    here = Path(__file__)
    files = sorted(Path(models.__file__).parent.rglob("*.py")) + [here.with_name("training.py"),
                                                                   here.with_name("graph_step.py")]
    digest = hashlib.sha1()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def compile_cache_file(config: RunConfig, device: torch.device) -> Path | None:
    """The compilation cache file of ``config``'s training step on ``device`` in the folder that
    ``$LENGTHBENCH_COMPILE_CACHE`` names, or None where it names none."""
    root = os.environ.get(COMPILE_CACHE_ENV, "")
    if not root:
        return None
    key = [torch.__version__, device_description(device), model_source_digest(),
           *(getattr(config, name) for name in _GRAPH_FIELDS)]
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return Path(root) / f"{config.task}-{config.attn}-{config.pe}-b{config.batch_size}-{digest}.bin"


def load_compile_cache(path: Path | None) -> str:
    """Load a file of :func:`compile_cache_file` into this process's compilation caches; what happened, in words.
    A missing, stale or broken file costs only the compilation: it never stops a run."""
    if path is None or not path.exists():
        return ""
    try:  # torch warns and returns None where it cannot read the file (another version's format, corrupted)
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as error:  # noqa: BLE001 - whatever the reason, compile as without it
        info, why = None, f" ({type(error).__name__}: {error})"
    else:
        why = ""
    if info is None:
        return f"compile cache {path} not loaded{why}; compiling without it"
    return f"compile cache loaded from {path}"


def save_compile_cache(path: Path | None) -> str:
    """Write what this process compiled to ``path`` where it is missing; what happened, in words."""
    if path is None or path.exists():
        return ""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return ""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(saved[0]))
    return f"compile cache written to {path} ({len(saved[0]) / 2**20:.1f} MiB)"


def model_dispatches_to_kernels(model) -> bool:
    """Whether any attention layer of ``model`` may call a fused (Triton) op on this machine."""
    return any(block.attn.dispatches_to_kernel() for block in model.blocks)


# Inductor's options for the compiled training step in one CUDA graph (``lengthbench/graph_step.py``).
# - Mix-order reductions off: on, they fuse LayerNorm's backward over each token's features with the sums over tokens
#   of its weight and bias gradients and leave the last stage of those sums to eager aten sums of the partials (on
#   the paper MQMTAR model at batch 128, 18 such sums took 270 us of a 3.2 ms step on an H200); off, every
#   mechanism's step there is about 0.2 ms shorter.
# - Programmatic dependent launch on (a Triton kernel of Inductor's starts while the one before it drains; Hopper and
#   newer, elsewhere Inductor leaves it out) and the pointwise kernels' block sizes autotuned: softmax + RoPE's step
#   on MQMTAR at batch 128 about 2% faster on an H200, every mechanism's ratio to it unchanged.
# Coordinate-descent tuning (under 1% faster there) and two-dimensional pointwise tiles (about 1.5%) stay off: each
# took a cell's warm-up on a fresh machine past the 60 s a cell may take (62 and 67 s); combo kernels stay off: the
# step ran at about half the samples/s.
INDUCTOR_OPTIONS = {"triton.mix_order_reduction": False, "triton.enable_pdl": True, "max_autotune_pointwise": True}


def inductor_options(options: dict | None = None) -> dict:
    """The options of the training step's ``torch.compile``: ``options`` (default :data:`INDUCTOR_OPTIONS`) less
    those this torch does not have (an unknown option would fail the compilation)."""
    options = dict(INDUCTOR_OPTIONS if options is None else options)
    import torch._inductor.config as inductor_config

    def known(name: str) -> bool:
        holder = inductor_config
        *parents, leaf = name.split(".")
        for part in parents:
            holder = getattr(holder, part, None)
            if holder is None:
                return False
        return hasattr(holder, leaf)

    return {name: value for name, value in options.items() if known(name)}


# Training batches at most this many tokens wide run the dense reference attention instead of the fused ops
# (scores ``[batch, heads, T, T]`` in float32: 0.5 GB a layer at batch 128, 16 heads, 256 tokens).
DENSE_TRAIN_MAX_TOKENS = 256


def trains_in_graph(config: RunConfig, device: torch.device) -> bool:
    """Whether the whole training step is captured in one CUDA graph (:class:`lengthbench.graph_step.GraphStep`):
    on CUDA unless the config asks for the ``compiled`` step. :func:`compiles` and :func:`trains_dense` say what
    the ``compiled`` step does; the Trainer asks them only where this is False."""
    return device.type == "cuda" and config.train_step in ("graph", "graph-compiled")


def trains_dense(config: RunConfig, model, device: torch.device, max_tokens: int) -> bool:
    """Whether the training step runs the attention's dense references, compiled, instead of its fused ops: on
    CUDA where the config compiles and asks for it (``train_attention = "reference"``; the default is the fused
    ops), for models with fused ops, when a training batch is at most :data:`DENSE_TRAIN_MAX_TOKENS` tokens wide
    (``max_tokens``). At the papers' training lengths (64: 66-131 tokens) a fused op gains nothing, and a model
    that calls one cannot be compiled (see ``Trainer.__init__``): it trains eagerly, one launch per operation.
    The references are the same functions, tested against the kernels; validation and scoring still call the
    fused ops."""
    return (device.type == "cuda" and config.compile and config.train_attention == "reference"
            and model_dispatches_to_kernels(model) and max_tokens <= DENSE_TRAIN_MAX_TOKENS)


def compiles(config: RunConfig, model, device: torch.device, max_tokens: int) -> bool:
    """Whether the training step is compiled: on CUDA where the config asks, for models that call no fused op
    in training (none at all, or the dense references instead: :func:`trains_dense`)."""
    return device.type == "cuda" and config.compile and (
        not model_dispatches_to_kernels(model) or trains_dense(config, model, device, max_tokens))


# The fused ops' launch settings in the training step recorded into a CUDA graph (lengthbench/graph_step.py), by op
# name: those under which an op decides nothing on the host from its data (no host sync, no launch sized by a count
# on the device), so that the graph can record it, on the tiles that the training widths (66-131 tokens a row)
# run fastest on.
# - entmax and sparsemax: the threshold in one kernel and the output over all keys (no candidate lists, no gathered
#   open rows); 1.5-entmax over rows of at most 256 keys by the short-rows kernels (each row's keys in registers).
# - softpick and TRA (``utils/rowwise.py``): tiles of 64 query rows x 32 keys forward and 32 x 32 backward.
# - TDA: no activity map, its forward on tiles of 32 rows, its backward without its dq kernel (the dk/dv kernel
#   on 64 x 32 adds dq and the per-row gradients atomically), and where a head's rows fit 128, its whole backward
#   in one program a head.
# - stick-breaking and sieve-window: the long-context op on 64-row 32-key tiles with one-bf16 sums, the values of
#   key tiles without a kept key skipped, no loads ahead; stick-breaking's forward without the causal masks on the
#   tiles before the diagonal.
# - Sieve (Section 3): its threshold found with every row's keys in registers (up to 256 keys, the search past
#   them), then the stick-breaking walk above.
_ROWWISE_CAPTURE = {"fwd": (64, 32, 4), "bwd": (32, 32, 4)}
_STICK_CAPTURE = {"cumsum": "bf16", "full_tiles": False, "prefetch": False, "skip_empty": True}
CAPTURE_TUNING: dict[str, dict] = {
    "entmax": {"lists": False, "split": False, "short_rows": True},
    "sparsemax": {"lists": False, "split": False},
    "sieve": {"lists": False, "split": False, "threshold": "short_rows", "walk": dict(_STICK_CAPTURE)},
    "tda": {"map": 0, "fwd": (32, 32, 4), "dq": (32, 32, 4), "dkdv": (64, 32, 4), "fused_bwd": True,
            "rows": (128, 32, 4)},
    "softpick": dict(_ROWWISE_CAPTURE),
    "tra": dict(_ROWWISE_CAPTURE),
    "stickbreaking": dict(_STICK_CAPTURE, full_tiles=True),
    "sieve-window": dict(_STICK_CAPTURE),
}


@contextlib.contextmanager
def attention_kernels(model, enabled: bool | list[bool], capturable: bool | None = None) -> Iterator[None]:
    """Set each attention layer's ``use_kernels`` (one flag for all, or one per layer) and, where given,
    ``capturable`` (the fused ops as nodes of the compiled graph, with the launch settings that a CUDA graph
    records: :data:`CAPTURE_TUNING`) inside the block, and restore the previous flags after it."""
    layers = [block.attn for block in model.blocks]
    before = [(layer.use_kernels, layer.capturable, layer.kernel_tuning) for layer in layers]
    flags = enabled if isinstance(enabled, list) else [enabled] * len(layers)
    for layer, flag in zip(layers, flags, strict=True):
        layer.use_kernels = flag
        if capturable is not None:
            layer.capturable = capturable
            layer.kernel_tuning = CAPTURE_TUNING if capturable else {}
    try:
        yield
    finally:
        for layer, (flag, capture, tuning) in zip(layers, before, strict=True):
            layer.use_kernels, layer.capturable, layer.kernel_tuning = flag, capture, tuning
