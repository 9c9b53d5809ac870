"""Ranges of every numeric option and parameter, memory estimates, and writable-folder checks.

One place decides what a number may be: the command line, sweep files and the regression check all call
these functions before any work starts, and each problem is a one-line :class:`UsageError` naming the
option and the accepted range. Mechanism, encoding and task parameters are checked by name
(:data:`PARAM_RANGES`) and by the type of the constructor's default.

Limits:

- seeds are 0 .. 2**63 - 1 (numpy's and torch's generators take 64-bit seeds);
- ``--max-multiplier`` is a power of two up to :data:`MAX_MULTIPLIER` (1024, the papers' protocol), and the
  longest evaluation length ``train_length * max_multiplier`` is at most :data:`MAX_LENGTH` nominal
  tokens (131,072: n_train 128 at 1024x);
- a length whose single-sample forward pass would not fit in memory is refused with the estimate
  (:func:`check_memory`).
"""

from __future__ import annotations

import errno
import inspect
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lengthbench.errors import UsageError

MAX_SEED = 2**63 - 1
MAX_MULTIPLIER = 1024
MAX_LENGTH = 131_072  # nominal tokens: the longest evaluation length of any task's default at 1024x
MAX_SEEDS = 10_000  # seeds in one sweep
MAX_CELLS = 100_000  # runs in one sweep
MAX_COUNT = 2**31 - 1  # samples in one `tasks sample`
MAX_VOCAB = 1_000_000  # symbols of a task's alphabet

# (low, high, low_open, high_open) per parameter name, for the keyword parameters of mechanisms, encodings
# and tasks; a key "NAME.param" applies to one mechanism or encoding only. None: unbounded on that side.
PARAM_RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    # mechanisms
    "alpha": (1.0, 64.0, True, False),  # alpha-entmax: alpha > 1 (alpha = 1 is softmax)
    "eps": (0.0, None, True, False),  # softpick's denominator epsilon; sieve-window's filter width
    "s_init": (None, None, False, False),
    "delta": (None, None, False, False),
    "gamma_scale": (0.0, None, False, False),
    "beta": (0.0, None, True, False),
    "kappa": (0.0, None, True, False),  # tau = beta * sqrt(2 log((n + 1) / kappa) / d) needs kappa > 0
    "power": (0.0, None, True, False),
    "lambda_init": (0.0, 1.0, True, True),
    # encodings (RoPE with Llama-3 scaling)
    "base": (1.0, None, True, False),
    "factor": (1.0, None, False, False),
    "low_freq_factor": (0.0, None, True, False),
    "high_freq_factor": (0.0, None, True, False),
    "original_context": (1, MAX_LENGTH * 64, False, False),
    # tasks: alphabet sizes, counts and probabilities
    "symbols": (1, MAX_VOCAB, False, False),
    "classes": (1, MAX_VOCAB, False, False),
    "alphabet": (1, MAX_VOCAB, False, False),
    "keys": (1, MAX_VOCAB, False, False),
    "values": (1, MAX_VOCAB, False, False),
    "key_max": (1, 10**15, False, False),
    "digits": (1, 64, False, False),
    "p_write": (0.0, 1.0, False, False),
    "p_ignore": (0.0, 1.0, False, False),
    "density": (0.0, 1.0, False, False),
    "depth_jitter": (0.0, 1.0, False, False),
}
# Any other integer parameter: within these bounds (a count that large never fits in memory anyway).
INT_PARAM_RANGE = (-(2**31), 2**31 - 1)

# Options of a run: (low, high); integers unless the default is a float.
RUN_RANGES: dict[str, tuple[float, float]] = {
    "train_length": (1, MAX_LENGTH),
    "eval_samples": (1, 10**8),
    "train_samples": (1, 10**12),
    "batch_size": (1, 2**20),
    "warmup_steps": (0, 10**12),
    "eval_every": (1, 10**12),
    "val_samples": (1, 10**8),
    "checkpoint_every": (1, 10**12),
    "d_model": (1, 2**16),
    "n_layers": (1, 1024),
    "n_heads": (1, 2**12),
    "ffn": (1, 2**18),
    "diagnostic_rows": (0, 2**20),
    "eval_tokens_per_batch": (0, 2**40),
}
FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {  # (low, high, low_open)
    "lr": (0.0, 10.0, True),
    "min_lr_ratio": (0.0, 1.0, False),
    "weight_decay": (0.0, 10.0, False),
    "grad_clip": (0.0, 1e6, False),
}


FLAGS = {"n_layers": "--layers", "n_heads": "--heads", "task_params": "--param", "attn_params": "--attn-param",
         "pe_params": "--pe-param"}


def flag(name: str) -> str:
    """The option of ``lengthbench run`` that sets RunConfig field ``name``."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def field(name: str) -> str:
    """A RunConfig field as a sweep file names it."""
    return name


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in [low, high]; a bool, a float or a string is refused by name."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise UsageError(f"{name} must be {_range_words(low, high)}, got {value:,}")
    return value


def check_float(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite number in its range (NaN and infinities are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number, got {value}")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        raise UsageError(f"{name} must be {_range_words(low, high, low_open, high_open)}, got {value:g}")
    return value


def _range_words(low, high, low_open: bool = False, high_open: bool = False) -> str:
    def show(x) -> str:
        return f"{x:,}" if isinstance(x, int) else f"{x:g}"

    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{show(low)}, {show(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {show(low)}"
    return f"{'<' if high_open else '<='} {show(high)}"


def check_seed(value: Any, name: str = "--seed") -> int:
    return check_int(name, value, 0, MAX_SEED)


def check_max_multiplier(value: Any, name: str = "--max-multiplier") -> int:
    check_int(name, value, 1, MAX_MULTIPLIER)
    if value & (value - 1):
        raise UsageError(f"{name} must be a power of two (1, 2, 4, ..., {MAX_MULTIPLIER}), got {value:,}")
    return value


def check_length(value: Any, name: str = "--length", task=None) -> int:
    """A nominal length within the design limit and, given ``task``, the task's own range."""
    check_int(name, value, 1, MAX_LENGTH)
    if task is not None:
        try:
            task.check_length(value)
        except ValueError as error:  # the task's own range: "needs a length of at least 6"
            raise UsageError(f"{name}: {error}") from error
    return value


# -- parameters of mechanisms, encodings and tasks ----------------------------------------------------

def check_param(name: str, key: str, value: Any, default: Any = inspect.Parameter.empty, *, owner: str = "") -> None:
    """One keyword parameter: its type from ``default`` (a number where the default is one, a string
    where it is a string) and its range from :data:`PARAM_RANGES`. ``name`` says where it came from
    (``--attn-param``)."""
    label = f"{name} {key}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UsageError(f"{label} must be true or false, got {value!r}")
        return
    if isinstance(default, str):
        if not isinstance(value, str):
            raise UsageError(f"{label} must be a word, got {value!r}")
        return
    bounds = PARAM_RANGES.get(f"{owner}.{key}", PARAM_RANGES.get(key))
    if isinstance(default, int) or (default is inspect.Parameter.empty and isinstance(value, int)
                                    and not isinstance(value, bool) and bounds is None):
        if isinstance(value, float) and value.is_integer() and isinstance(default, int):
            value = int(value)
        low, high = (bounds[0], bounds[1]) if bounds else INT_PARAM_RANGE
        check_int(label, value, None if low is None else math.ceil(low), None if high is None else int(high))
        return
    if isinstance(default, float) or bounds is not None or isinstance(value, float):
        low, high, low_open, high_open = bounds or (None, None, False, False)
        check_float(label, value, low, high, low_open=low_open, high_open=high_open)


def constructor_params(cls, base: type, skip: frozenset[str] = frozenset(
        {"self", "d_model", "n_heads", "pe", "head_dim"})) -> dict[str, Any]:
    """``{key: default}`` of the keyword parameters that ``cls`` and its bases down to ``base`` take (what
    ``--attn-param`` / ``--pe-param`` accept), the nearest class's default first."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, base)) or "__init__" not in klass.__dict__:
            continue
        for parameter in inspect.signature(klass.__dict__["__init__"]).parameters.values():
            if parameter.name in skip or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                continue
            found.setdefault(parameter.name, parameter.default)
    return found


def check_component_params(kind: str, name: str, params: Mapping[str, Any]) -> None:
    """``--attn-param`` (``kind="attn"``) or ``--pe-param`` (``kind="pe"``) values of mechanism or encoding
    ``name``: every key one its constructor takes, every value of its default's type and in its range."""
    if kind == "attn":
        from lengthbench.models.attention import ATTENTION as registry
        from lengthbench.models.attention.base import AttentionLayer as base
        words = "attention"
    else:
        from lengthbench.models.positional import POSITIONAL_ENCODINGS as registry
        from lengthbench.models.positional import PositionalEncoding as base
        words = "positional encoding"
    canonical = registry.canonical(name)
    accepted = constructor_params(registry.get(canonical), base)
    for key, value in params.items():
        if key not in accepted:
            raise UsageError(f"{words} {canonical!r} takes no parameter {key!r}; its parameters: "
                             f"{', '.join(accepted) or 'none'}")
        check_param(f"--{kind}-param", key, value, accepted[key], owner=canonical)


def check_task_params(task: str, params: Mapping[str, Any]) -> None:
    """``--param`` values of ``task``: known keys (the task says which), types and ranges by name."""
    import dataclasses

    from lengthbench.tasks import TASKS

    if task not in TASKS:
        return  # the registry's own error names the choices
    fields = {f.name: f.default for f in dataclasses.fields(TASKS.get(TASKS.canonical(task)).Params)}
    for key, value in params.items():
        if key in fields:
            check_param("--param", key, value, fields[key])


# -- a run's configuration ------------------------------------------------------------------------------

def field_types() -> dict[str, type]:
    """The type of each :class:`~lengthbench.config.RunConfig` field, read from its default (``str`` for the
    names without one)."""
    import dataclasses

    from lengthbench.config import RunConfig

    types = {}
    for item in dataclasses.fields(RunConfig):
        if item.default is not dataclasses.MISSING:
            types[item.name] = type(item.default)
        elif item.default_factory is not dataclasses.MISSING:
            types[item.name] = type(item.default_factory())
        else:
            types[item.name] = str
    return types


def check_overrides(values: Mapping[str, Any], name=flag) -> None:
    """The RunConfig fields among ``values`` (a command's options, a sweep file's ``[overrides]``, a stored
    configuration), before anything computes with them: each of its field's type (true/false, a word, a table,
    a list), the numbers in their ranges; ``name`` turns a field into what the user wrote (a flag, or the field
    itself for a sweep file). None values are left out (the preset's apply)."""
    types = field_types()
    for key, value in values.items():
        if value is None:
            continue
        kind = types.get(key)
        if kind is bool and not isinstance(value, bool):
            raise UsageError(f"{name(key)} must be true or false, got {value!r}")
        if kind is str and not isinstance(value, str):
            raise UsageError(f"{name(key)} must be a string, got {value!r}")
        if kind is list and not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise UsageError(f"{name(key)} must be a list of strings, got {value!r}")
        if key == "seed":
            check_int(name(key), value, 0, MAX_SEED)
        elif key == "max_multiplier":
            check_max_multiplier(value, name(key))
        elif key in RUN_RANGES:
            check_int(name(key), value, *RUN_RANGES[key])
        elif key in FLOAT_RANGES:
            low, high, low_open = FLOAT_RANGES[key]
            check_float(name(key), value, low, high, low_open=low_open)
        elif key in ("task_params", "attn_params", "pe_params") and not isinstance(value, Mapping):
            raise UsageError(f"{name(key)} must be a table of key = value, got {value!r}")
        elif kind is int:
            check_int(name(key), value)
        elif kind is float:
            check_float(name(key), value)


def check_stored_config(data: Mapping[str, Any], name=field) -> None:
    """A whole configuration as :meth:`RunConfig.to_json` writes it (a baseline's cell): every field there
    (those of :data:`~lengthbench.config.LATER_FIELDS` may be missing, from configurations written before
    them), none unknown, each of its type and range (:func:`check_overrides`). Nothing is filled in silently:
    a missing training budget would start a full training."""
    from lengthbench.config import LATER_FIELDS

    types = field_types()
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise UsageError(f"unknown configuration field {unknown[0]!r}")
    missing = [key for key in types if key not in data and key not in LATER_FIELDS]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise UsageError(f"the configuration lacks the field{'s' if len(missing) > 1 else ''} {shown} (a config "
                         "holds every field, as `lengthbench check --update` writes it; or give \"overrides\" of "
                         "a preset instead)")
    check_overrides(data, name)


def check_config(config, where: str = "", name=flag) -> None:
    """Every numeric field of a :class:`~lengthbench.config.RunConfig` in its range, its parameters checked,
    and its longest evaluation length within :data:`MAX_LENGTH`. ``where`` prefixes the message (a sweep's
    cell)."""
    try:
        check_overrides({key: getattr(config, key) for key in ("seed", "max_multiplier", *RUN_RANGES,
                                                               *FLOAT_RANGES)}, name)
        longest = config.train_length * config.max_multiplier
        if longest > MAX_LENGTH:
            raise UsageError(f"{name('train_length')} {config.train_length} x {name('max_multiplier')} "
                             f"{config.max_multiplier} is "
                             f"{longest:,} tokens; the longest evaluation length is {MAX_LENGTH:,}")
        check_task_params(config.task, config.task_params)
        check_component_params("attn", config.attn, config.attn_params)
        check_component_params("pe", config.pe, config.pe_params)
    except UsageError as error:
        if where:
            raise UsageError(f"{where}: {error}") from error
        raise


# -- memory -------------------------------------------------------------------------------------------

def available_memory(device: str = "cpu") -> int:
    """Bytes the device has in all: physical memory, or the first CUDA device's memory."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


def forward_bytes(tokens: int, d_model: int, n_layers: int, vocab: int, ffn: int | None = None) -> int:
    """A lower bound on the memory of one sample's forward pass at ``tokens`` tokens, in float32: the
    residual stream, q/k/v and the MLP's hidden layer per layer, and the logits. The quadratic attention
    scores are not counted: the fused kernels and the query chunks of the dense path never hold them."""
    ffn = ffn or 4 * d_model
    per_token = n_layers * (6 * d_model + 2 * ffn) + vocab + 2 * d_model
    return 4 * tokens * per_token


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} PiB"


def check_memory(what: str, needed: int, device: str = "cpu") -> None:
    """Refuse ``what`` up front where its estimate ``needed`` exceeds the device's memory."""
    total = available_memory(device)
    if needed > total:
        kind = "GPU memory" if device.startswith("cuda") else "memory"
        raise UsageError(f"{what} needs about {human_bytes(needed)}, more than the {human_bytes(total)} of {kind} here")


def parameter_count(d_model: int, n_layers: int, vocab: int, ffn: int) -> int:
    """About the decoder's weights: attention and MLP per layer, embedding and output layer."""
    return n_layers * (4 * d_model * d_model + 2 * d_model * ffn) + 2 * vocab * d_model


def check_run_memory(config, device: str = "cpu") -> None:
    """A run must fit: its training (weights, gradients and Adam's two moments, 16 bytes a weight, and a
    batch's forward pass at n_train) and one sample's forward pass at its longest evaluation length
    (:func:`forward_bytes`)."""
    from lengthbench.tasks import get_task

    task = get_task(config.task, **config.task_params)
    vocab = len(task.vocab)
    weights = 16 * parameter_count(config.d_model, config.n_layers, vocab, config.ffn)
    train_tokens = task.max_tokens(config.train_length)
    training = weights + config.batch_size * forward_bytes(train_tokens, config.d_model, config.n_layers, vocab,
                                                           config.ffn)
    check_memory(f"training ({parameter_count(config.d_model, config.n_layers, vocab, config.ffn):,} weights, "
                 f"batch {config.batch_size} x {train_tokens:,} tokens)", training, device)
    n = config.train_length * config.max_multiplier
    tokens = task.max_tokens(n)
    needed = weights // 4 + forward_bytes(tokens, config.d_model, config.n_layers, vocab, config.ffn)
    check_memory(f"evaluating at n = {n:,} ({tokens:,} tokens)", needed, device)


# -- files and folders --------------------------------------------------------------------------------

def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_writable(path: str | Path, option: str, *, folder: bool = True) -> Path:
    """Refuse, before any work, a ``path`` the command could not write: an empty name, a file where a
    folder is wanted (or the reverse), a device, FIFO or socket where a file is wanted, a path under a regular
    file, a name too long, a folder without write permission. Nothing is created. Returns the path."""
    if str(path).strip() == "":
        raise UsageError(f"{option} is empty: give a folder name (e.g. {option} runs)")
    path = Path(path)
    for part in path.parts:
        if len(os.fsencode(part)) > 255:
            raise UsageError(f"{option} {_short(path)}: a name in it is longer than 255 bytes")
    if path.exists():
        if folder and not path.is_dir():
            raise UsageError(f"{option} {path} is a file, not a folder")
        if not folder and path.is_dir():
            raise UsageError(f"{option} {path} is a folder, not a file")
        if not folder:
            from lengthbench.store import refuse_special_file

            refuse_special_file(path, option)
        target = path if folder else path.parent
    else:
        target = path.parent if str(path.parent) else Path(".")
        while not target.exists() and target != target.parent:
            target = target.parent
        if not target.is_dir():
            raise UsageError(f"{option} {path}: {target} is a file, so nothing can be created under it")
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: no permission to write in {target}")
    return path


def check_publish(folder: str | Path, names: tuple[str, ...], option: str = "--publish") -> Path:
    """A folder that a command publishes the files ``names`` in: :func:`check_writable`, and none of those files a
    device, FIFO or socket, all checked before the first is written (so that a pair is never half replaced)."""
    from lengthbench.store import refuse_special_file

    path = check_writable(folder, option)
    for name in names:
        refuse_special_file(path / name)
    return path


def check_results_writable(results: str | Path, option: str = "--results") -> Path:
    """The store folder and the subfolders a run writes (runs/, checkpoints/, logs/, claims/)."""
    path = check_writable(results, option)
    for sub in ("runs", "checkpoints", "logs", "claims"):
        child = path / sub
        if child.exists() and not child.is_dir():
            raise UsageError(f"{option} {path}: {child} is a file, not a folder")
        if child.exists() and not os.access(child, os.W_OK | os.X_OK):
            raise UsageError(f"{option} {path}: no permission to write in {child}")
    return path


def check_results_readable(results: str | Path, option: str = "--results") -> Path:
    """A store that a command only reads (``sweep --dry-run``, ``--status``): a folder or nothing yet, its
    ``runs/`` a folder it may list; write permission is not needed."""
    if str(results).strip() == "":
        raise UsageError(f"{option} is empty: give a folder name (e.g. {option} runs)")
    path = Path(results)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder")
    runs = path / "runs"
    if runs.exists() and not runs.is_dir():
        raise UsageError(f"{option} {path}: {runs} is a file, not a folder")
    for folder in (path, runs):
        if folder.exists() and not os.access(folder, os.R_OK | os.X_OK):
            raise UsageError(f"{option} {path}: no permission to read {folder}")
    return path


def _short(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 60 else text[:28] + "..." + text[-28:]


def os_error_message(error: OSError) -> str:
    """One line for a filesystem error: what failed and where."""
    names = {errno.ENAMETOOLONG: "file name too long", errno.EACCES: "permission denied",
             errno.EPERM: "operation not permitted", errno.EISDIR: "is a folder, not a file",
             errno.ENOTDIR: "a part of the path is a file, not a folder", errno.EEXIST: "already exists",
             errno.ENOSPC: "no space left on the device", errno.EROFS: "read-only file system"}
    what = names.get(error.errno, (error.strerror or type(error).__name__).lower())
    where = error.filename if error.filename is not None else ""
    if error.filename2 is not None:
        where = f"{where} -> {error.filename2}"
    where = _short(Path(str(where))) if where != "" else ""
    return f"{where}: {what}" if where else what
