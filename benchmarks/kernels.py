"""Fused kernels vs PyTorch SDPA (flash backend, causal): forward and forward+backward time, peak memory.

    python benchmarks/kernels.py --out results/benchmarks

Writes ``kernels.parquet`` (one row per mechanism, length and head dim, each with its date, device, commit and
command: ``created_at``, ``device``, ``git_sha``, ``command``) and ``kernels.md`` (the table, and at the longest length the ratios to SDPA against the targets below). Times are medians of
``triton.testing.do_bench``; peak memory is ``torch.cuda.max_memory_allocated`` over one forward+backward
step, inputs (q, k, v, the output gradient) included, for both the kernel and SDPA. Random inputs, B=1,
H=16, bf16 by default.

    python benchmarks/kernels.py --merge NEW_DIR --out results/benchmarks

(no GPU needed) replaces the rows that ``NEW_DIR/kernels.parquet`` measured again (the same mechanism, length
and head dim) in ``--out``'s, keeps the others, and rewrites both files.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shlex
import subprocess
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

from lengthbench.kernels import get_kernel, kernel_names

# The targets: fwd within FWD_TARGET x SDPA and fwd+bwd within FWDBWD_TARGET x; tra/tda at least as fast.
FWD_TARGET = {"stickbreaking": 1.5, "sieve-entmax": 1.5, "softpick": 1.5, "rectified": 1.5, "entmax": 1.5,
              "tra": 1.0, "tda": 1.0}
FWDBWD_TARGET = {"stickbreaking": 3.0, "sieve-entmax": 3.0, "softpick": 3.0, "rectified": 3.0, "entmax": 3.0,
                 "tra": 1.0, "tda": 1.0}
MEMORY_TARGET = 1.5


def inputs(heads, tokens, head_dim, dtype, unit=False, seed=0, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(1, heads, tokens, head_dim, device="cuda", generator=gen) for _ in range(4))
    if unit:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    else:
        q, k = q * scale, k * scale
    return [t.to(dtype).requires_grad_(i < 3) for i, t in enumerate((q, k, v, do))]


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
    if name == "tda-2pass":
        return tda_two_passes
    op = get_kernel(name)
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
    parser.add_argument("--merge", default="", help="a directory with a later kernels.parquet: its rows replace "
                                                       "--out's of the same mechanism, length and head dim (no "
                                                       "measurement)")
    args = parser.parse_args()
    if args.merge:
        write(merge(pd.read_parquet(Path(args.out) / FILE_STEM.with_suffix(".parquet")),
                    pd.read_parquet(Path(args.merge) / FILE_STEM.with_suffix(".parquet"))), args.out)
        return
    dtype = torch.bfloat16
    device = torch.cuda.get_device_name()
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    commit, command = git_commit(), shlex.join(["python", "benchmarks/kernels.py", *sys.argv[1:]])
    rows = []
    for head_dim in [int(x) for x in args.head_dims.split(",")]:
        for tokens in [int(x) for x in args.lengths.split(",")]:
            base = measure(sdpa, *inputs(args.heads, tokens, head_dim, dtype))
            for name in args.mechanisms.split(","):
                tensors = inputs(args.heads, tokens, head_dim, dtype, unit=name in ("tra", "tda", "tda-2pass"),
                                 scale=args.scale)
                fwd, fwdbwd, peak = measure(kernel_fn(name), *tensors)
                del tensors
                torch.cuda.empty_cache()
                rows.append(dict(mechanism=name, seq_len=tokens, head_dim=head_dim, heads=args.heads,
                                 dtype=str(dtype).removeprefix("torch."), fwd_ms=fwd, fwdbwd_ms=fwdbwd,
                                 sdpa_fwd_ms=base[0], sdpa_fwdbwd_ms=base[1], peak_mem_bytes=peak,
                                 sdpa_peak_mem_bytes=base[2], device=device, created_at=created,
                                 input_scale=args.scale, git_sha=commit, command=command))
                print(f"{name:14s} L={tokens:6d} D={head_dim:3d} fwd {fwd:9.3f} ms ({fwd / base[0]:5.2f}x) "
                      f"fwd+bwd {fwdbwd:9.3f} ms ({fwdbwd / base[1]:5.2f}x) "
                      f"mem {peak / 2**20:8.1f} MiB ({peak / base[2]:4.2f}x)", flush=True)
                save(rows, args.out)
    print(report(pd.DataFrame(rows)))


def merge(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old`` with every row that ``new`` measured again (the same mechanism, length and head dim) replaced by
    ``new``'s; ``old``'s other rows stay, those of the same mechanism at other shapes too."""
    keys = ["mechanism", "seq_len", "head_dim"]
    again = old.set_index(keys).index.isin(new.set_index(keys).index)
    return pd.concat([old[~again], new], ignore_index=True)


def save(rows, out_dir):
    """Rewritten after every measurement, so an interrupted run keeps what it measured."""
    write(pd.DataFrame(rows), out_dir)


FILE_STEM = Path("kernels")


def git_commit() -> str:
    """The checkout's short commit, ``+`` when its tracked files differ from it; ``LENGTHBENCH_GIT_SHA`` where it is
    set (a copy of the checkout without ``.git``, as the runner reads it); ``unknown`` otherwise."""
    if os.environ.get("LENGTHBENCH_GIT_SHA"):
        return os.environ["LENGTHBENCH_GIT_SHA"]

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent)
    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+" if dirty else "")


def write(frame: pd.DataFrame, out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / FILE_STEM.with_suffix(".parquet"), index=False)
    (out / FILE_STEM.with_suffix(".md")).write_text(report(frame))


def report(frame: pd.DataFrame) -> str:
    longest = frame.seq_len.max()
    dates = sorted(frame.created_at.unique())
    when = dates[0] if len(dates) == 1 else (f"between {dates[0]} and {dates[-1]} (each row's date and commit "
                                              "below; a later row replaces an earlier one of the same mechanism, "
                                              "length and head dim: `--merge`)")
    lines = [f"# Fused kernels vs SDPA (flash, causal): {frame.device.iloc[0]}, {frame.dtype.iloc[0]}, "
             f"B=1, H={frame.heads.iloc[0]}", "", f"Measured {when} by "
             "`benchmarks/kernels.py`; medians of `triton.testing.do_bench`; peak memory of one fwd+bwd step, "
             f"inputs included. Inputs N(0, 1), q and k times {_input_scale(frame):g} "
             "(SDPA's: unscaled).", "",
             "Again: `python benchmarks/kernels.py --out results/benchmarks` on one GPU (every kernel, L 1,024 to "
             "65,536, D 32 and 64; each row's own command is in the Parquet's `command`).", "",
             "| mechanism | L | D | fwd ms | SDPA fwd ms | fwd+bwd ms | SDPA fwd+bwd ms | peak MiB | SDPA peak MiB "
             "| date | commit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    commits = frame["git_sha"] if "git_sha" in frame else pd.Series("", index=frame.index)
    for r in frame.assign(git_sha=commits.fillna("")).sort_values(["head_dim", "mechanism", "seq_len"]).itertuples():
        lines.append(f"| {r.mechanism} | {r.seq_len} | {r.head_dim} | {r.fwd_ms:.3f} | {r.sdpa_fwd_ms:.3f} | "
                     f"{r.fwdbwd_ms:.3f} | {r.sdpa_fwdbwd_ms:.3f} | {r.peak_mem_bytes / 2**20:.1f} | "
                     f"{r.sdpa_peak_mem_bytes / 2**20:.1f} | {str(r.created_at)[:10]} | {r.git_sha} |")
    lines += ["", f"## Ratios to SDPA at L={longest}, D=32 (against the targets)", "",
              "| mechanism | fwd / SDPA (target) | fwd+bwd / SDPA (target) | peak mem / SDPA (target 1.5) | met |",
              "|---|---:|---:|---:|---|"]
    at = frame[(frame.seq_len == longest) & (frame.head_dim == 32)]
    for r in at.sort_values("mechanism").itertuples():
        fwd, fb, mem = r.fwd_ms / r.sdpa_fwd_ms, r.fwdbwd_ms / r.sdpa_fwdbwd_ms, r.peak_mem_bytes / r.sdpa_peak_mem_bytes
        ft, fbt = FWD_TARGET.get(r.mechanism, math.inf), FWDBWD_TARGET.get(r.mechanism, math.inf)
        met = [label for label, ok in (("fwd", fwd <= ft), ("fwd+bwd", fb <= fbt), ("mem", mem <= MEMORY_TARGET))
               if ok]
        missed = [label for label in ("fwd", "fwd+bwd", "mem") if label not in met]
        lines.append(f"| {r.mechanism} | {fwd:.2f} ({_target(ft)}) | {fb:.2f} ({_target(fbt)}) | {mem:.2f} | "
                     f"{'all' if not missed else 'missed: ' + ', '.join(missed)} |")
    lines += ["", "Notes:", "",
              "- stickbreaking stops walking left once every row of a query tile has accumulated 60 nats of "
              "softplus (the remaining weights are below e^-60). Random inputs get there within about a hundred "
              "keys, so its times here are a best case; a model whose scores stay very negative walks further.",
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
