"""Fused kernels vs PyTorch SDPA (flash backend, causal): forward and forward+backward time, peak memory.

    python benchmarks/kernels.py --out results/benchmarks

Writes ``kernels.parquet`` (one row per mechanism, length and head dim, each with its date, device, commit and
command: ``created_at``, ``device``, ``git_sha``, ``command``) and ``kernels.md`` (the table, and at the longest length the ratios to SDPA against the targets below). Times are medians of
``triton.testing.do_bench``; peak memory is ``torch.cuda.max_memory_allocated`` over one forward+backward
step, inputs (q, k, v, the output gradient) included, for both the kernel and SDPA. Random inputs, B=1,
H=16, bf16 by default.

Input families (``--inputs``, rows labelled by ``inputs``; SDPA timed on the same tensors):

- ``random``: q, k, v, the output gradient N(0, 1), q and k times ``--scale`` (tra and tda: unit rows).
- ``walk4``, ``walk8``: the random inputs with every score moved by -4 or -8: q's first component set to 1
  and k's to ``-N sqrt(D)`` (rounded to the inputs' dtype), so with the ops' default ``sm_scale = 1 / sqrt(D)``
  a score is ``-N`` plus the product of the other ``D - 1`` components. Stick-breaking's stick is then not
  spent within a few keys (``e^-8`` a key: it walks every key of a row at 65,536), as in trained models that
  recall far back. Not for tra and tda (cosine scores: skipped).
- ``trained``: q, k, v of a trained model (``--trained results/checkpoints/<run_id>/model.pt``, a run of
  the results store; its config is in the checkpoint): one sample of its task at nominal length L (test
  split, seed 0), run through the model under bf16 autocast up to layer ``--layer``, whose projected q, k,
  v (positions applied, ``AttentionLayer.project``) are taken by a forward hook on that layer; the first L
  tokens are kept (the row's ``seq_len`` is what the sample had, if fewer). The model's heads and head dim
  replace ``--heads`` and ``--head-dims``; its ALiBi slopes or row scales, if any, are not passed (the op
  runs on q, k, v alone); the output gradient is random.

Variants (``--variant NAME=JSON``, repeatable): the same measurement with ``tuning=JSON`` passed to the
mechanisms whose op takes it (rows labelled by ``variant``; ``default`` the op's own settings, always
measured), e.g. the stick-breaking levers of ``kernels/stickbreaking.py``'s ``launch_config``:

    python benchmarks/kernels.py --mechanisms stickbreaking,sieve-window --lengths 65536 --inputs random,walk8 \
        --variant 'prefix={"backward": "prefix", "split": false}' --out /tmp/sb

    python benchmarks/kernels.py --merge NEW_DIR --out results/benchmarks

(no GPU needed) replaces the rows that ``NEW_DIR/kernels.parquet`` measured again (the same mechanism, length,
head dim, inputs and variant) in ``--out``'s, keeps the others, and rewrites both files. Rows of files from
before the ``inputs`` and ``variant`` columns read as ``random`` and ``default``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import math
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:  # measuring needs Triton; --merge does not
    import triton
except ModuleNotFoundError:  # pragma: no cover - CPU-only installs
    triton = None

from lengthbench.devices import git_sha
from lengthbench.kernels import get_kernel, kernel_names

# The targets: fwd within FWD_TARGET x SDPA and fwd+bwd within FWDBWD_TARGET x; tra/tda at least as fast. The
# committed rows measured before Sieve's names of the results store's schema version 3 name Sieve "sieve-entmax" and
# sieve-window "sieve-alg1" (lengthbench.store.RENAMED): they keep their targets under those names.
FWD_TARGET = {"stickbreaking": 1.5, "sieve": 1.5, "sieve-entmax": 1.5, "softpick": 1.5, "rectified": 1.5,
              "entmax": 1.5, "tra": 1.0, "tda": 1.0}
FWDBWD_TARGET = {"stickbreaking": 3.0, "sieve": 3.0, "sieve-entmax": 3.0, "softpick": 3.0, "rectified": 3.0,
                 "entmax": 3.0, "tra": 1.0, "tda": 1.0}
MEMORY_TARGET = 1.5
# On the other input families (long walks, trained models): the stick-breaking family's targets.
WALK_FWD_TARGET = {"stickbreaking": 2.0, "sieve-window": 2.0, "sieve-alg1": 2.0}
WALK_FWDBWD_TARGET = {"stickbreaking": 3.0, "sieve-window": 3.0, "sieve-alg1": 3.0}
FAMILIES = ("random", "walk4", "walk8", "trained")
WALK_SHIFT = {"walk4": -4.0, "walk8": -8.0}
UNIT_INPUTS = ("tra", "tda", "tda-2pass")


def inputs(heads, tokens, head_dim, dtype, unit=False, seed=0, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(1, heads, tokens, head_dim, device="cuda", generator=gen) for _ in range(4))
    if unit:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    else:
        q, k = q * scale, k * scale
    return [t.to(dtype).requires_grad_(i < 3) for i, t in enumerate((q, k, v, do))]


def walk_inputs(q, k, shift):
    """``q, k`` with every score ``q.k / sqrt(D)`` moved by ``shift``: q's first component 1, k's ``shift
    sqrt(D)`` (in their dtype)."""
    q, k = q.detach().clone(), k.detach().clone()
    q[..., 0] = 1.0
    k[..., 0] = shift * math.sqrt(q.shape[-1])
    return q, k


def family_inputs(family, heads, tokens, head_dim, dtype, unit=False, scale=1.0, captured=None):
    """``[q, k, v, do]`` of an input family (see the module docstring), q, k, v requiring gradients."""
    if family == "trained":
        q, k, v = captured
        gen = torch.Generator(device="cuda").manual_seed(0)
        do = torch.randn(q.shape, device="cuda", generator=gen)
        return [t.to(dtype).requires_grad_(i < 3) for i, t in enumerate((q, k, v, do))]
    q, k, v, do = inputs(heads, tokens, head_dim, dtype, unit=unit, scale=scale)
    if family in WALK_SHIFT:
        q, k = walk_inputs(q, k, WALK_SHIFT[family])
    return [t.detach().requires_grad_(i < 3) for i, t in enumerate((q, k, v, do))]


class _Captured(Exception):
    """Stops the model's forward once the layer's q, k, v are taken."""


def capture_qkv(checkpoint, layer: int, tokens: int, device: str = "cuda"):
    """``(q, k, v)``, each ``[1, H, L, D]``, of layer ``layer`` of the trained model at ``checkpoint`` (a
    ``checkpoints/<run_id>/model.pt`` of a results store) on one test sample of nominal length ``tokens``,
    the first ``tokens`` positions kept (see the module docstring; bf16 autocast on CUDA)."""
    from lengthbench.checkpoints import load_model
    from lengthbench.errors import UsageError
    from lengthbench.models.attention.base import AttentionLayer

    path = Path(checkpoint)
    if not path.is_file():
        raise UsageError(f"--trained: no checkpoint at {path}")
    model, task, _ = load_model(path.parent.parent.parent, path.parent.name, device)
    layers = [m for m in model.modules() if isinstance(m, AttentionLayer)]
    if not 0 <= layer < len(layers):
        raise UsageError(f"--layer {layer}: the model has {len(layers)} attention layers")
    batch = task.batch(range(1), tokens, "test", 0)
    ids = torch.as_tensor(batch.input_ids[:, :tokens], device=device)
    features = None if batch.features is None else torch.as_tensor(batch.features[:, :tokens], device=device)
    taken = {}

    def hook(module, args):
        taken["qkv"] = tuple(t.detach().contiguous() for t in module.project(args[0]))
        raise _Captured

    handle = layers[layer].register_forward_pre_hook(hook)
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            model(ids, features)
    except _Captured:
        pass
    finally:
        handle.remove()
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return taken["qkv"]


def takes_tuning(name: str) -> bool:
    """Whether mechanism ``name``'s op takes ``tuning`` (its launch settings and levers)."""
    from lengthbench.kernels import _KERNELS

    if name not in _KERNELS:
        return False
    module, function = _KERNELS[name].split(":")
    op = getattr(importlib.import_module(f"lengthbench.kernels.{module}"), function)
    return "tuning" in inspect.signature(op).parameters


def parse_variants(entries) -> list[tuple[str, dict | None]]:
    """``[("default", None), (name, tuning), ...]`` from ``--variant NAME=JSON`` entries."""
    out = [("default", None)]
    for entry in entries or []:
        name, sep, text = entry.partition("=")
        try:
            tuning = json.loads(text) if sep else None
        except json.JSONDecodeError as error:
            raise SystemExit(_usage(f"--variant {entry!r}: the tuning is not JSON ({error})")) from None
        if not name or not isinstance(tuning, dict) or name in dict(out):
            raise SystemExit(_usage(f"--variant {entry!r}: give NAME=JSON, a new name and a JSON object"))
        out.append((name, {key: tuple(x) if isinstance(x, list) else x for key, x in tuning.items()}))
    return out


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def measure(fn, q, k, v, do):
    """(fwd_ms, fwdbwd_ms, peak_bytes) of ``fn(q, k, v)``."""
    with torch.no_grad():
        fwd = triton.testing.do_bench(lambda: fn(q, k, v), warmup=25, rep=100, return_mode="median")

    def step():
        fn(q, k, v).backward(do)

    fwdbwd = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
    for t in (q, k, v):
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    for t in (q, k, v):
        t.grad = None
    return fwd, fwdbwd, peak


def sdpa(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def kernel_fn(name, tuning=None):
    if name == "tda-2pass":
        return tda_two_passes
    op = get_kernel(name)
    if tuning is not None:
        base = op
        op = lambda q, k, v: base(q, k, v, tuning=tuning)  # noqa: E731
    if name == "tra":
        return lambda q, k, v: op(q, k, v, sm_scale=1.0)
    if name == "tda":  # two views from the same inputs: (q, k) and (k, q)
        return lambda q, k, v: op(q, k, k, q, v, lam=0.5, sm_scale=1.0)
    return op


def tda_two_passes(q, k, v):
    """TDA as two tra passes (same views as ``tda``), the baseline the one-pass op is measured against."""
    op = get_kernel("tra")
    return op(q, k, v, sm_scale=1.0) - 0.5 * op(k, q, v, sm_scale=1.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/benchmarks")
    parser.add_argument("--lengths", default="1024,4096,16384,65536")
    parser.add_argument("--head-dims", default="32,64")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--mechanisms", default=",".join(kernel_names()))
    parser.add_argument("--scale", type=float, default=1.0,
                        help="factor on q and k (not tra/tda's unit inputs): the scores' spread, which sets the "
                             "supports of entmax, sparsemax and sieve (0.1: near-uniform scores, large supports)")
    parser.add_argument("--inputs", default="random",
                        help=f"input families, comma-separated, of {', '.join(FAMILIES)} (see the module docstring)")
    parser.add_argument("--trained", default="", help="the trained inputs' checkpoint: "
                        "RESULTS/checkpoints/<run_id>/model.pt of a lengthbench run")
    parser.add_argument("--layer", type=int, default=0, help="the trained model's attention layer (from 0)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help="time the mechanisms whose op takes tuning also with tuning=JSON, rows labelled NAME "
                             "(repeatable; the default settings are always timed)")
    parser.add_argument("--merge", default="", help="a directory with a later kernels.parquet: its rows replace "
                                                       "--out's of the same mechanism, length, head dim, inputs "
                                                       "and variant (no measurement)")
    args = parser.parse_args()
    if args.merge:
        write(merge(pd.read_parquet(Path(args.out) / FILE_STEM.with_suffix(".parquet")),
                    pd.read_parquet(Path(args.merge) / FILE_STEM.with_suffix(".parquet"))), args.out)
        return
    families = args.inputs.split(",")
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        sys.exit(_usage(f"--inputs: unknown families {unknown}; they are {', '.join(FAMILIES)}"))
    if "trained" in families and not args.trained:
        sys.exit(_usage("--inputs trained needs --trained CHECKPOINT"))
    variants = parse_variants(args.variant)
    dtype = torch.bfloat16
    device = torch.cuda.get_device_name()
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = shlex.join(["python", "benchmarks/kernels.py", *sys.argv[1:]])
    rows = []
    for family in families:
        for head_dim in [int(x) for x in args.head_dims.split(",")] if family != "trained" else [0]:
            for tokens in [int(x) for x in args.lengths.split(",")]:
                captured = None
                if family == "trained":
                    try:
                        captured = capture_qkv(args.trained, args.layer, tokens)
                    except ValueError as error:  # UsageError
                        sys.exit(_usage(str(error)))
                shape = dict(heads=args.heads, tokens=tokens, head_dim=head_dim, captured=captured)
                base = measure(sdpa, *family_inputs(family, dtype=dtype, **shape))
                for name in args.mechanisms.split(","):
                    if family != "random" and name in UNIT_INPUTS:
                        continue  # cosine scores: no walk, no trained capture
                    for variant, tuning in variants if takes_tuning(name) else variants[:1]:
                        tensors = family_inputs(family, dtype=dtype, unit=name in UNIT_INPUTS, scale=args.scale,
                                                **shape)
                        heads, length, dim = tensors[0].shape[1:]
                        try:
                            fwd, fwdbwd, peak = measure(kernel_fn(name, tuning), *tensors)
                        except ValueError as error:  # a variant's keys of another op's tuning
                            if tuning is None:
                                raise
                            print(f"{name:14s} {family:7s} {variant:12s} skipped: {error}", flush=True)
                            continue
                        finally:
                            del tensors
                        torch.cuda.empty_cache()
                        rows.append(dict(mechanism=name, seq_len=length, head_dim=dim, heads=heads,
                                         dtype=str(dtype).removeprefix("torch."), fwd_ms=fwd, fwdbwd_ms=fwdbwd,
                                         sdpa_fwd_ms=base[0], sdpa_fwdbwd_ms=base[1], peak_mem_bytes=peak,
                                         sdpa_peak_mem_bytes=base[2], device=device, created_at=created,
                                         input_scale=args.scale, inputs=family, variant=variant,
                                         tuning=json.dumps(tuning, sort_keys=True) if tuning else "",
                                         trained=args.trained if family == "trained" else "",
                                         git_sha=git_sha(), command=command))
                        print(f"{name:14s} {family:7s} {variant:12s} L={length:6d} D={dim:3d} fwd {fwd:9.3f} ms "
                              f"({fwd / base[0]:5.2f}x) fwd+bwd {fwdbwd:9.3f} ms ({fwdbwd / base[1]:5.2f}x) "
                              f"mem {peak / 2**20:8.1f} MiB ({peak / base[2]:4.2f}x)", flush=True)
                        save(rows, args.out)
    print(report(pd.DataFrame(rows)))


def merge(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old`` with every row that ``new`` measured again (the same mechanism, length, head dim, inputs and
    variant) replaced by ``new``'s; ``old``'s other rows stay, those of the same mechanism at other shapes too."""
    old, new = labelled(old), labelled(new)
    keys = ["mechanism", "seq_len", "head_dim", "inputs", "variant"]
    again = old.set_index(keys).index.isin(new.set_index(keys).index)
    return pd.concat([old[~again], new], ignore_index=True)


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``inputs`` and ``variant`` (``random`` and ``default`` where a row has none: files
    from before the columns)."""
    out = frame.copy()
    for column, value in (("inputs", "random"), ("variant", "default")):
        out[column] = out[column].fillna(value) if column in out else value
    return out


def save(rows, out_dir):
    """Rewritten after every measurement, so an interrupted run keeps what it measured."""
    write(pd.DataFrame(rows), out_dir)


FILE_STEM = Path("kernels")


def write(frame: pd.DataFrame, out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / FILE_STEM.with_suffix(".parquet"), index=False)
    (out / FILE_STEM.with_suffix(".md")).write_text(report(frame))


def _variant_lines(frame: pd.DataFrame) -> list[str]:
    """One line per variant other than ``default``: its name and the tuning it passes (Markdown)."""
    if "tuning" not in frame:
        return []
    named = frame[frame["variant"] != "default"].drop_duplicates("variant")
    if named.empty:
        return []
    return ["Variants: " + "; ".join(f"`{row.variant}` = `{row.tuning}`" for row in named.itertuples()) + ".", ""]


def report(frame: pd.DataFrame) -> str:
    frame = labelled(frame)
    dates = sorted(frame.created_at.unique())
    when = dates[0] if len(dates) == 1 else (f"between {dates[0]} and {dates[-1]} (each row's date and commit "
                                              "below; a later row replaces an earlier one of the same mechanism, "
                                              "length, head dim, inputs and variant: `--merge`)")
    devices = sorted(frame.device.unique())
    lines = [f"# Fused kernels vs SDPA (flash, causal): {' and '.join(devices)}, {frame.dtype.iloc[0]}, "
             f"B=1, H={frame.heads.iloc[0]}", "", f"Measured {when} by "
             "`benchmarks/kernels.py`; medians of `triton.testing.do_bench`; peak memory of one fwd+bwd step, "
             f"inputs included. Random inputs N(0, 1), q and k times {_input_scale(frame):g} "
             "(SDPA's: unscaled); `walk4`/`walk8` those with every score moved by -4/-8, `trained` q, k, v of a "
             "trained model (the module docstring says how), SDPA timed on the same tensors. A variant other "
             "than `default` passes its `tuning` (the Parquet's `tuning` column) to the op.", "",
             *_variant_lines(frame),
             "Again: `python benchmarks/kernels.py --out results/benchmarks` on one GPU (every kernel, L 1,024 to "
             "65,536, D 32 and 64; each row's own command is in the Parquet's `command`).", "",
             "Each row's SDPA columns were measured beside it, on its `device`.", "",
             "| mechanism | L | D | fwd ms | SDPA fwd ms | fwd+bwd ms | SDPA fwd+bwd ms | peak MiB | SDPA peak MiB "
             "| inputs | variant | device | date | commit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|"]
    commits = frame["git_sha"] if "git_sha" in frame else pd.Series("", index=frame.index)
    order = ["inputs", "head_dim", "mechanism", "variant", "seq_len"]
    for r in frame.assign(git_sha=commits.fillna("")).sort_values(order).itertuples():
        lines.append(f"| {r.mechanism} | {r.seq_len} | {r.head_dim} | {r.fwd_ms:.3f} | {r.sdpa_fwd_ms:.3f} | "
                     f"{r.fwdbwd_ms:.3f} | {r.sdpa_fwdbwd_ms:.3f} | {r.peak_mem_bytes / 2**20:.1f} | "
                     f"{r.sdpa_peak_mem_bytes / 2**20:.1f} | {r.inputs} | {r.variant} | {r.device} | "
                     f"{str(r.created_at)[:10]} | "
                     f"{r.git_sha} |")
    families = [f for f in FAMILIES if f in set(frame.inputs)] + sorted(set(frame.inputs) - set(FAMILIES))
    for family in families:
        rows = frame[frame.inputs == family]
        longest = rows.seq_len.max()
        fwd_targets, fwdbwd_targets = ((FWD_TARGET, FWDBWD_TARGET) if family == "random" else
                                       (WALK_FWD_TARGET, WALK_FWDBWD_TARGET))
        for head_dim in sorted(rows[rows.seq_len == longest].head_dim.unique()):
            at = rows[(rows.seq_len == longest) & (rows.head_dim == head_dim)]
            lines += ["", f"## Ratios to SDPA at L={longest}, D={head_dim}, {family} inputs (against the targets)",
                      "", "| mechanism | fwd / SDPA (target) | fwd+bwd / SDPA (target) | peak mem / SDPA (target 1.5) "
                      "| met |", "|---|---:|---:|---:|---|"]
            for r in at.sort_values(["mechanism", "variant"]).itertuples():
                fwd, fb = r.fwd_ms / r.sdpa_fwd_ms, r.fwdbwd_ms / r.sdpa_fwdbwd_ms
                mem = r.peak_mem_bytes / r.sdpa_peak_mem_bytes
                ft, fbt = fwd_targets.get(r.mechanism, math.inf), fwdbwd_targets.get(r.mechanism, math.inf)
                met = [label for label, ok in (("fwd", fwd <= ft), ("fwd+bwd", fb <= fbt),
                                               ("mem", mem <= MEMORY_TARGET)) if ok]
                missed = [label for label in ("fwd", "fwd+bwd", "mem") if label not in met]
                name = r.mechanism if r.variant == "default" else f"{r.mechanism} [{r.variant}]"
                lines.append(f"| {name} | {fwd:.2f} ({_target(ft)}) | {fb:.2f} ({_target(fbt)}) | {mem:.2f} | "
                             f"{'all' if not missed else 'missed: ' + ', '.join(missed)} |")
    lines += ["", "Notes:", "",
              "- stickbreaking stops walking left once every row of a query tile has accumulated 60 nats of "
              "softplus (the remaining weights are below e^-60). Random inputs get there within about a hundred "
              "keys, so its times here are a best case; a model whose scores stay very negative walks further: "
              "the `walk4` rows (spent after a few thousand keys) and `walk8` rows (every key of a row at "
              "65,536) measure that case, against the targets fwd 2x and fwd+bwd 3x SDPA (stickbreaking, "
              "sieve-window).",
              "- entmax, sparsemax and sieve first find the threshold: a pass that keeps the 4 largest scores "
              "of each of the 64 key columns per row (the exact threshold of that subset is a lower bound, and "
              "the threshold itself where no column's 4th largest is above it), then Newton/exact passes over "
              "the rows left open only. The rows certified with at most 64 candidates (99% here) are finished "
              "from those candidates' lists; the open ones (sieve: its filtered stick-breaking walk, with "
              "stickbreaking's 60-nat exit) over all their keys. How many rows stay open depends on the scores "
              "(`--scale`).",
              "- tda is the one-pass op (both views per key tile; the module runs it) on unit inputs like tra: its "
              "forward is timed without gradients (no activity map), its backward visits only the tiles the map "
              "lists; tda-2pass is two tra passes, for comparison.",
              "- rela has no speed target."]
    return "\n".join(lines) + "\n"


def _input_scale(frame: pd.DataFrame) -> float:
    """The runs' ``--scale`` (rows from before the column existed ran at 1)."""
    scales = frame.get("input_scale", pd.Series(dtype=float)).fillna(1.0)
    return float(scales.iloc[0]) if len(scales) else 1.0


def _target(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:g}"


if __name__ == "__main__":
    main()
