"""The entmax threshold kernel's variants (``kernels/entmax.py``, ``TUNING``): the threshold alone and the
whole entmax forward, against SDPA (flash, causal) forward.

    python benchmarks/entmax_variants.py --out results/kernels/session11 --lengths 16384,65536

Each variant overrides some of the kernel's launch settings (query tile ``bm``, key tiles ``bn`` and
``bn_subset``, ``warps``, ``stages``, and ``newton`` for the split launch's Newton kernel) and search
settings (``split``: the Newton passes as a second kernel over the open rows only; ``subset``: 0 the old
top-16 tile maxima, d the top d of every key column; ``acc``: elementwise partial sums in the Newton passes;
``fold``: one scale product; ``lists``: the forward finishes the certified rows from their candidate lists,
``list_size`` slots a row, ``finish`` = (rows a program, warps) of the finishing kernel; ``pairs``: the first
stage merges two key tiles a step, session 15; ``rescue``: the rows left open with few saturated columns
scanned into lists, session 22); ``old`` is the
search and launch before session 11, ``default`` the kernel's defaults (the list forward), ``nolists`` the
default search followed by the output pass over all keys (the forward before session 12). Random N(0, 1) q, k, v times ``--scale`` (so scores of standard deviation ``scale^2``), B 1, H 16,
bf16. Times are medians of ``--reps`` runs between CUDA events after ``--warmup`` runs; the first stage's
time is that of ``max_iter=0`` (for split variants with the gathering and the empty Newton launch). Every
variant's ``tau`` is compared with ``old``'s (max |difference| over the finite entries, and whether the
infinite ones agree); "moving" are the fractions of rows whose ``tau`` still changes (by over 1e-6
relative) after the first stage and after one Newton pass (rows left open but already exact do not count);
registers and spills are those of the kernels the variant compiled first (split: first stage / Newton).
"fwd peak" is the peak memory of one entmax forward without gradient beyond the inputs (and SDPA's); "listed"
the fraction of rows the list forward finishes from their lists (list variants only); with ``--sieve`` also
Sieve's forward (``sieve_fwd_ms``; the list variants apply to it too).
Writes ``entmax_variants.parquet``, ``.csv`` and ``.md``, rewritten after each measurement.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import torch
import triton

from kernels import inputs, sdpa  # benchmarks/kernels.py
from lengthbench.kernels import entmax, sieve

VARIANTS = {
    "old": dict(entmax._OLD),
    "default": None,
    "old-fold": dict(entmax._OLD, fold=True),
    "old-split": dict(entmax._OLD, split=True),
    "fused-sub3": dict(split=False, subset=3, bm=128, bn=64, warps=8),
    "fused-sub3-acc": dict(split=False, subset=3, bm=128, bn=64, warps=8, acc=True),
    "fused-sub4": dict(split=False, subset=4),
    "sub2": dict(subset=2),
    "sub3": dict(subset=3),
    "sub4-acc": dict(acc=True),
    "sub4-nofold": dict(fold=False),
    "sub4-bm128-w8": dict(bm=128, warps=8),
    "sub4-bm64-w8": dict(warps=8),
    "sub4-st3": dict(stages=3),
    "sub4-n128-64w8": dict(newton=(128, 64, 8, 2)),
    "sub4-n32w4": dict(newton=(32, 32, 4, 2)),
    "sub4-bns32": dict(bn_subset=32),
    "nolists": dict(lists=False),
    "nopairs": dict(pairs=False),
    # session 22: rows not certified, with at most max_sat saturated columns, finished from lists that a scan
    # of those columns completes (_rescue_kernel); rescue_launch = (rows a program, keys a step, warps)
    # (the default since session 23)
    "rescue": dict(rescue=True),
    "norescue": dict(rescue=False),
    "rescue-sat8": dict(rescue=True, max_sat=8),
    "rescue-r4k128": dict(rescue=True, rescue_launch=(4, 128, 4)),
    # session 23: with the rescue, 1% of the rows stay open at N(0, 1), and their Newton passes and output
    # pass (2.9 + 1.3 ms) are few programs walking every key: smaller, or deeper-pipelined, query tiles there
    # (newton = (rows, keys a step, warps, stages), also Sieve's open rows)
    "open-n32": dict(newton=(32, 32, 4, 2)),
    "open-n32w2": dict(newton=(32, 32, 2, 2)),
    "open-n32s3": dict(newton=(32, 32, 4, 3)),
    "open-n16": dict(newton=(16, 16, 2, 2)),
    "open-n64s3": dict(newton=(64, 32, 4, 3)),
    "rescue-c128": dict(list_size=128),
    # session 23: Sieve's listed rows sorted by key in registers, the stick's suffix sums a cumulative sum
    "sieve-scan": dict(sieve_scan=True),
    "sieve-scan-r8": dict(sieve_scan=True, finish=(8, 4)),
    "scan-open-n32": dict(sieve_scan=True, newton=(32, 32, 4, 2)),
    "open-n64s4": dict(newton=(64, 32, 4, 4)),
    "open-n64k64": dict(newton=(64, 64, 4, 3)),
    "finish-r2": dict(finish=(2, 4)),
    "finish-r8w8": dict(finish=(8, 8)),
    # Sieve's open rows' walk on tiles of its own (entmax's Newton passes keep 64 rows)
    "sieve-open-n32": dict(sieve_open=(32, 32, 4, 3)),
    "sieve-open-n32s2": dict(sieve_open=(32, 32, 4, 2)),
    "sieve-open-n16": dict(sieve_open=(16, 16, 2, 3)),
    # session 24: where the open rows are few (``few_open``: at most 256 a multiprocessor, 16,384 tokens or
    # more), the open rows' kernels on smaller tiles (the last rows' walk is then the critical path)
    "few-sieve-n16": dict(sieve_open_few=(16, 16, 2, 3)),
    "few-sieve-n16w1": dict(sieve_open_few=(16, 16, 1, 3)),
    "few-sieve-n32": dict(sieve_open_few=(32, 32, 4, 3)),
    "few-newton-n16": dict(newton_few=(16, 16, 2, 3)),
    "few-newton-n32": dict(newton_few=(32, 32, 4, 3)),
    "few-n16": dict(newton_few=(16, 16, 2, 3), sieve_open_few=(16, 16, 2, 3)),
    "lists-r1": dict(finish=(1, 4)),
    "lists-r2": dict(finish=(2, 4)),
    "lists-r8": dict(finish=(8, 4)),
    "lists-r4w8": dict(finish=(4, 8)),
    "lists-c32": dict(list_size=32),
    "lists-c128": dict(list_size=128),
}


def git_commit() -> str:
    sha = os.environ.get("LENGTHBENCH_GIT_SHA")
    if sha:
        return sha
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def time_ms(fn, warmup: int, reps: int) -> float:
    """Median of ``reps`` runs of ``fn`` between CUDA events, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def fwd_peak_mib(fn) -> float:
    """Peak memory of ``fn()`` above what is allocated before it, MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def listed_fraction(q, k, v, alpha) -> float:
    """The fraction of rows the list forward finishes from their lists (nan where it does not run)."""
    if not entmax._lists_apply(q):
        return float("nan")
    pb = entmax.Problem(q, k, v, None, None, None)
    ncand = entmax._lists_forward(pb, alpha, False)[5]
    return (ncand > 0).float().mean().item()


def compiled_kernels() -> dict:
    """The threshold search's compiled kernels so far, by (kernel, cache key) (Triton's per-device caches)."""
    found = {}
    for kernel in (entmax._threshold_kernel, entmax._start_kernel, entmax._newton_kernel):
        for entry in getattr(kernel, "device_caches", {}).values():
            cache = entry[0] if isinstance(entry, tuple) else entry
            found.update({(kernel.__name__, key): compiled for key, compiled in cache.items()})
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/kernels/entmax_variants")
    parser.add_argument("--lengths", default="16384,65536")
    parser.add_argument("--head-dims", default="32,64")
    parser.add_argument("--scale", type=float, default=1.0, help="q and k times this (score std scale^2)")
    parser.add_argument("--alpha", type=float, default=1.5, help="1.5 (entmax) or 2 (sparsemax)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--sieve", action="store_true", help="also time Sieve's forward (alpha 1.5, strict)")
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    commit = git_commit()
    print(f"device: {device}\ndate: {created}\ngit: {commit}\ntorch {torch.__version__} "
          f"triton {triton.__version__}\nB 1, H {args.heads}, bf16, scale {args.scale}, alpha {args.alpha}",
          flush=True)
    names = args.variants.split(",")
    if names[0] != "old":
        names = ["old", *[n for n in names if n != "old"]]  # every tau is compared with old's
    rows = []
    for head_dim in [int(x) for x in args.head_dims.split(",")]:
        for tokens in [int(x) for x in args.lengths.split(",")]:
            with torch.no_grad():
                stamp = dict(device=device, created_at=created, git=commit)
                measure_case(args, tokens, head_dim, names, rows, stamp)
            torch.cuda.empty_cache()


def measure_case(args, tokens, head_dim, names, rows, stamp):
    """Every variant at one length and head dim, appended to ``rows`` (and saved after each)."""
    q, k, v, _ = inputs(args.heads, tokens, head_dim, torch.bfloat16, scale=args.scale)
    timing = (args.warmup, args.reps)
    sdpa_ms = time_ms(lambda: sdpa(q, k, v), *timing)
    sdpa_mib = fwd_peak_mib(lambda: sdpa(q, k, v))
    reference = None
    for name in names:
        entmax.TUNING = VARIANTS[name]
        try:
            before = set(compiled_kernels())
            tau = entmax.entmax_threshold(q, k, alpha=args.alpha)
            new = [kern for key, kern in compiled_kernels().items() if key not in before]
            config = entmax._config(max(16, triton.next_power_of_2(head_dim)))
            thr_ms = time_ms(lambda: entmax.entmax_threshold(q, k, alpha=args.alpha), *timing)
            first_ms = time_ms(lambda: entmax.entmax_threshold(q, k, alpha=args.alpha, max_iter=0), *timing)
            fwd_ms = time_ms(lambda: entmax.entmax_attention(q, k, v, alpha=args.alpha), *timing)
            fwd_mib = fwd_peak_mib(lambda: entmax.entmax_attention(q, k, v, alpha=args.alpha))
            listed = listed_fraction(q, k, v, args.alpha)
            sieve_ms = time_ms(lambda: sieve.sieve_attention(q, k, v), *timing) if args.sieve else float("nan")
        except Exception as error:  # a variant whose tiles do not compile at this head dim
            print(f"{name:14s} L={tokens:6d} D={head_dim:3d} failed: {type(error).__name__}: "
                  f"{str(error).splitlines()[0][:200]}", flush=True)
            continue
        finally:
            entmax.TUNING = None
        if reference is None:
            reference = tau
        moving = []  # rows whose tau still changes after the first stage, and after one Newton pass
        for passes in (0, 1):
            entmax.TUNING = VARIANTS[name]
            early = entmax.entmax_threshold(q, k, alpha=args.alpha, max_iter=passes)
            entmax.TUNING = None
            moving.append(((early - tau).abs() > 1e-6 * (1 + tau.abs())).float().mean().item())
        finite = torch.isfinite(reference)
        same_inf = bool(torch.equal(finite, torch.isfinite(tau)))
        diff = (tau - reference)[finite].abs().max().item() if finite.any() else 0.0
        regs = "/".join(str(getattr(kernel, "n_regs", None)) for kernel in new)  # split: first stage/Newton
        spills = "/".join(str(getattr(kernel, "n_spills", None)) for kernel in new)
        rows.append(dict(variant=name, config=str(config), seq_len=tokens, head_dim=head_dim,
                         heads=args.heads, dtype="bfloat16", scale=args.scale, alpha=args.alpha,
                         threshold_ms=thr_ms, first_stage_ms=first_ms, entmax_fwd_ms=fwd_ms, sdpa_fwd_ms=sdpa_ms,
                         fwd_peak_mib=fwd_mib, sdpa_fwd_peak_mib=sdpa_mib, listed=listed, sieve_fwd_ms=sieve_ms,
                         tau_max_abs_diff=diff,
                         tau_inf_agree=same_inf, moving_after_first=moving[0], moving_after_one_pass=moving[1],
                         n_regs=regs, n_spills=spills, **stamp))
        print(f"{name:14s} L={tokens:6d} D={head_dim:3d} threshold {thr_ms:8.2f} ms (first stage "
              f"{first_ms:6.2f})  entmax fwd "
              f"{fwd_ms:8.2f} ms ({fwd_ms / sdpa_ms:5.2f}x SDPA {sdpa_ms:.2f})  fwd peak {fwd_mib:7.1f} MiB "
              f"({fwd_mib / max(sdpa_mib, 1e-9):4.2f}x SDPA)  listed {listed:.3f}  sieve fwd {sieve_ms:7.2f} ms  "
              f"|dtau| vs old {diff:.1e}"
              f"{'' if same_inf else ' INF MISMATCH'}  moving {moving[0]:.3f}/{moving[1]:.4f}  "
              f"regs {regs} spills {spills}", flush=True)
        save(rows, args.out)


def save(rows, out_dir):
    frame = pd.DataFrame(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "entmax_variants.parquet", index=False)
    frame.to_csv(out / "entmax_variants.csv", index=False)
    first = frame.iloc[0]
    lines = [f"# Entmax threshold variants vs SDPA (flash, causal): {first.device}, bf16, B=1, "
             f"H={first.heads}, alpha {first.alpha}, N(0, 1) q/k times {first.scale}", "",
             f"Measured {first.created_at} at git {first.git} by `benchmarks/entmax_variants.py`; medians of "
             "CUDA event times. |dtau|: max over the finite entries against `old`.", "",
             "| variant | L | D | threshold ms | first stage ms | entmax fwd ms | / SDPA | fwd peak MiB | / SDPA | "
             "listed | \\|dtau\\| vs old | moving after first | after one pass | regs | spills | config |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in frame.itertuples():
        lines.append(f"| {r.variant} | {r.seq_len} | {r.head_dim} | {r.threshold_ms:.2f} | "
                     f"{r.first_stage_ms:.2f} | "
                     f"{r.entmax_fwd_ms:.2f} | {r.entmax_fwd_ms / r.sdpa_fwd_ms:.2f} | {r.fwd_peak_mib:.1f} | "
                     f"{r.fwd_peak_mib / max(r.sdpa_fwd_peak_mib, 1e-9):.2f} | {r.listed:.3f} | {r.tau_max_abs_diff:.1e}"
                     f"{'' if r.tau_inf_agree else ' (inf differ)'} | {r.moving_after_first:.3f} | "
                     f"{r.moving_after_one_pass:.4f} | {r.n_regs} | {r.n_spills} | `{r.config}` |")
    (out / "entmax_variants.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
