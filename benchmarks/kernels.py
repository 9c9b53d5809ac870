"""Fused kernels vs PyTorch SDPA (flash backend, causal): forward and forward+backward time, peak memory.

    python benchmarks/kernels.py --out results/benchmarks

Times are medians of ``triton.testing.do_bench``; peak memory is ``torch.cuda.max_memory_allocated`` over one
forward+backward step, inputs (q, k, v, the output gradient) included, for both the kernel and SDPA. B=1, H=16,
bf16 by default; SDPA is timed on the same tensors as each kernel.

Input families (``--inputs``, rows labelled by ``inputs``):

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

Writes ``kernels.parquet`` (one row per mechanism, length, head dim and input family, each with its date, device,
commit and command: ``created_at``, ``device``, ``git_sha``, ``command``) and ``kernels.md`` (at each mechanism's
longest length, the ratios to SDPA against the targets below). The rows there that this command did not measure
again stay. ``--merge NEW_DIR`` (no GPU needed) joins the rows of ``NEW_DIR/kernels.parquet``, measured elsewhere,
into ``--out``'s the same way.
"""

from __future__ import annotations

import argparse
import datetime
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
from lengthbench.models.attention import get_kernel, kernel_names

# The targets: fwd within FWD_TARGET x SDPA and fwd+bwd within FWDBWD_TARGET x; tra/tda at least as fast.
FWD_TARGET = {"stickbreaking": 1.5, "sieve": 1.5, "softpick": 1.5, "rectified": 1.5, "entmax": 1.5,
              "tra": 1.0, "tda": 1.0}
FWDBWD_TARGET = {"stickbreaking": 3.0, "sieve": 3.0, "softpick": 3.0, "rectified": 3.0, "entmax": 3.0,
                 "tra": 1.0, "tda": 1.0}
MEMORY_TARGET = 1.5
# On the other input families (long walks, trained models): the stick-breaking family's targets.
WALK_FWD_TARGET = {"stickbreaking": 2.0, "sieve-window": 2.0}
WALK_FWDBWD_TARGET = {"stickbreaking": 3.0, "sieve-window": 3.0}
FAMILIES = ("random", "walk4", "walk8", "trained")
WALK_SHIFT = {"walk4": -4.0, "walk8": -8.0}
UNIT_INPUTS = ("tra", "tda")


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


def kernel_fn(name):
    op = get_kernel(name)
    if name == "tra":
        return lambda q, k, v: op(q, k, v, sm_scale=1.0)
    if name == "tda":  # two views from the same inputs: (q, k) and (k, q)
        return lambda q, k, v: op(q, k, k, q, v, lam=0.5, sm_scale=1.0)
    return op


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
    parser.add_argument("--merge", default="", help="a directory with a kernels.parquet measured elsewhere: its rows "
                        "replace --out's of the same mechanism, length, head dim and inputs (no measurement)")
    args = parser.parse_args()
    if args.merge:
        try:
            rows = pd.read_parquet(Path(args.merge) / FILE_STEM.with_suffix(".parquet"))
        except (OSError, ValueError) as error:
            sys.exit(_usage(f"--merge: {error}"))
        write(rows, args.out)
        return
    families = args.inputs.split(",")
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        sys.exit(_usage(f"--inputs: unknown families {unknown}; they are {', '.join(FAMILIES)}"))
    if "trained" in families and not args.trained:
        sys.exit(_usage("--inputs trained needs --trained CHECKPOINT"))
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
                    tensors = family_inputs(family, dtype=dtype, unit=name in UNIT_INPUTS, scale=args.scale, **shape)
                    heads, length, dim = tensors[0].shape[1:]
                    fwd, fwdbwd, peak = measure(kernel_fn(name), *tensors)
                    del tensors
                    torch.cuda.empty_cache()
                    rows.append(dict(mechanism=name, seq_len=length, head_dim=dim, heads=heads,
                                     dtype=str(dtype).removeprefix("torch."), fwd_ms=fwd, fwdbwd_ms=fwdbwd,
                                     sdpa_fwd_ms=base[0], sdpa_fwdbwd_ms=base[1], peak_mem_bytes=peak,
                                     sdpa_peak_mem_bytes=base[2], device=device, created_at=created,
                                     input_scale=args.scale, inputs=family,
                                     trained=args.trained if family == "trained" else "",
                                     git_sha=git_sha(), command=command))
                    print(f"{name:14s} {family:7s} L={length:6d} D={dim:3d} fwd {fwd:9.3f} ms "
                          f"({fwd / base[0]:5.2f}x) fwd+bwd {fwdbwd:9.3f} ms ({fwdbwd / base[1]:5.2f}x) "
                          f"mem {peak / 2**20:8.1f} MiB ({peak / base[2]:4.2f}x)", flush=True)
                    write(pd.DataFrame(rows), args.out)  # after every row: an interrupted run keeps what it measured
    print(report(pd.read_parquet(Path(args.out) / FILE_STEM.with_suffix(".parquet"))))


# a row of the table: a mechanism at one shape on one input family
KEY = ["mechanism", "seq_len", "head_dim", "inputs"]
FILE_STEM = Path("kernels")


def merge(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old`` with every row that ``new`` measured again (the same :data:`KEY`) replaced by ``new``'s; ``old``'s
    other rows stay, those of the same mechanism at other shapes too."""
    again = old.set_index(KEY).index.isin(new.set_index(KEY).index)
    return pd.concat([old[~again], new], ignore_index=True)


def write(rows: pd.DataFrame, out_dir) -> None:
    """``rows`` joined into the table in ``out_dir`` (:func:`merge`); the Parquet and its Markdown written."""
    out = Path(out_dir)
    path = out / FILE_STEM.with_suffix(".parquet")
    frame = merge(pd.read_parquet(path), rows) if path.exists() else rows
    out.mkdir(parents=True, exist_ok=True)
    frame.sort_values(["inputs", "head_dim", "mechanism", "seq_len"]).to_parquet(path, index=False)
    (out / FILE_STEM.with_suffix(".md")).write_text(report(frame))


def report(frame: pd.DataFrame) -> str:
    """Markdown: per input family, head dim and mechanism, its row at the longest length measured, its ratios to
    SDPA against the targets; then the commands, each with its device, date and commit."""
    longest = frame.sort_values("seq_len").drop_duplicates(["mechanism", "head_dim", "inputs"], keep="last")
    families = [f for f in FAMILIES if f in set(longest.inputs)] + sorted(set(longest.inputs) - set(FAMILIES))
    longest = longest.assign(order=longest.inputs.map(families.index)).sort_values(["order", "head_dim", "mechanism"])
    lines = [f"# Fused kernels vs SDPA (flash, causal), {frame.dtype.iloc[0]}, B=1, H={frame.heads.iloc[0]}", "",
             "Each mechanism's fused op at its longest length measured, against SDPA timed beside it on the same "
             "tensors: forward and forward+backward time (medians of `triton.testing.do_bench`) and peak memory of "
             f"one forward+backward step, inputs included. Inputs: `random` N(0, 1), q and k times "
             f"{_input_scale(frame):g}; `walk4`/`walk8` those with every score moved by -4/-8; `trained` q, k, v of "
             "a trained model (`benchmarks/kernels.py`'s docstring says how). Targets: forward within "
             f"{_target(FWD_TARGET['entmax'])}x SDPA and forward+backward within {_target(FWDBWD_TARGET['entmax'])}x "
             f"(tra and tda at least as fast as SDPA), peak memory within {MEMORY_TARGET:g}x; on the other input "
             f"families the stick-breaking family's {_target(WALK_FWD_TARGET['stickbreaking'])}x and "
             f"{_target(WALK_FWDBWD_TARGET['stickbreaking'])}x; `-` where a mechanism has none. Every length "
             "(1,024 to 65,536) is in `kernels.parquet`.", "",
             "| mechanism | inputs | L | D | fwd ms | fwd / SDPA (target) | fwd+bwd ms | fwd+bwd / SDPA (target) "
             "| peak mem / SDPA | met | device | date | commit |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|"]
    commits = longest["git_sha"].fillna("") if "git_sha" in longest else pd.Series("", index=longest.index)
    for r, commit in zip(longest.itertuples(), commits, strict=True):
        fwd_targets, fwdbwd_targets = ((FWD_TARGET, FWDBWD_TARGET) if r.inputs == "random" else
                                       (WALK_FWD_TARGET, WALK_FWDBWD_TARGET))
        fwd, fb = r.fwd_ms / r.sdpa_fwd_ms, r.fwdbwd_ms / r.sdpa_fwdbwd_ms
        mem = r.peak_mem_bytes / r.sdpa_peak_mem_bytes
        ft, fbt = fwd_targets.get(r.mechanism, math.inf), fwdbwd_targets.get(r.mechanism, math.inf)
        missed = [label for label, ok in (("fwd", fwd <= ft), ("fwd+bwd", fb <= fbt), ("mem", mem <= MEMORY_TARGET))
                  if not ok]
        lines.append(f"| {r.mechanism} | {r.inputs} | {r.seq_len} | {r.head_dim} | {r.fwd_ms:.3f} | {fwd:.2f} "
                     f"({_target(ft)}) | {r.fwdbwd_ms:.3f} | {fb:.2f} ({_target(fbt)}) | {mem:.2f} | "
                     f"{'all' if not missed else 'missed: ' + ', '.join(missed)} | {r.device} | "
                     f"{str(r.created_at)[:10]} | {commit} |")
    lines += ["", "Measured by (device, date, commit: command; each row's command is in `kernels.parquet`):", ""]
    for command, part in longest.sort_values("created_at").groupby("command", sort=False):
        first = part.iloc[0]
        commit = first["git_sha"] if "git_sha" in part and isinstance(first["git_sha"], str) else ""
        lines.append(f"- {first['device']}, {str(first['created_at'])[:10]}, commit {commit}: `{command}`")
    return "\n".join(lines) + "\n"


def _input_scale(frame: pd.DataFrame) -> float:
    """The rows' ``--scale``."""
    scales = frame.get("input_scale", pd.Series(dtype=float)).fillna(1.0)
    return float(scales.iloc[0]) if len(scales) else 1.0


def _target(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:g}"


if __name__ == "__main__":
    main()
