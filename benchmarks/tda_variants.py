"""The one-pass TDA op's launch variants (``kernels/tda.py``, ``TUNING``) against SDPA and two tra passes.

    python benchmarks/tda_variants.py --out results/kernels/session10

Each variant sets the tiles of the forward, dq and dk/dv kernels, whether the forward skips inactive tiles
by a branch, and the activity map (0: none, the backward tests every tile by a branch; 1: kept in
registers by the forward; 2: stored per tile), with which the backward visits only the active tiles. Unit
(cosine) q and k as the module has them, B 1, H 16, bf16, causal; the same timing as
``benchmarks/kernels.py``. Writes ``tda_variants.parquet`` and ``.md``, rewritten after each measurement.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import pandas as pd
import torch

from kernels import inputs, measure, sdpa, tda_two_passes  # benchmarks/kernels.py
from lengthbench.kernels import tda

VARIANTS = {
    "main": None,  # the op's defaults
    "fwd-noskip": dict(fwd=(128, 64, 8), dq=(64, 64, 8), dkdv=(64, 64, 8), skip=False, map=0),
    "map1-w4": dict(fwd=(128, 64, 8), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=False, map=1),
    "map1-w8": dict(fwd=(128, 64, 8), dq=(64, 64, 8), dkdv=(64, 64, 8), skip=False, map=1),
    "map1-skip": dict(fwd=(128, 64, 8), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=True, map=1),
    "map1-bn32": dict(fwd=(128, 32, 8), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=False, map=1),
    "map1-fwd4": dict(fwd=(128, 64, 4), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=False, map=1),
    "map2-w4": dict(fwd=(128, 64, 8), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=False, map=2),
    "map2-bm128": dict(fwd=(128, 64, 8), dq=(128, 64, 8), dkdv=(128, 64, 8), skip=False, map=2),
    # head dim 64: the forward's tiles at BN 32 (the single-view ops' choice) or 64
    "noskip-bn32": dict(fwd=(128, 32, 8), dq=(64, 32, 8), dkdv=(64, 64, 8), skip=False, map=0),
    "map1-bn32-w8": dict(fwd=(128, 32, 8), dq=(64, 32, 8), dkdv=(64, 64, 8), skip=False, map=1),
    "map1-bn64-w4": dict(fwd=(128, 64, 4), dq=(64, 32, 4), dkdv=(64, 64, 4), skip=False, map=1),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/kernels/session10")
    parser.add_argument("--lengths", default="65536")
    parser.add_argument("--head-dims", default="32,64")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--variants", default=",".join(["tda-2pass", *VARIANTS]))
    args = parser.parse_args()
    dtype, device = torch.bfloat16, torch.cuda.get_device_name()
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    op = lambda q, k, v: tda.tda_attention(q, k, k, q, v, lam=0.5)  # noqa: E731  (as benchmarks/kernels.py)
    # fwd is timed under no_grad (no activity map: the inference path), fwd+bwd with gradients (the map)
    rows = []
    for head_dim in [int(x) for x in args.head_dims.split(",")]:
        for tokens in [int(x) for x in args.lengths.split(",")]:
            base = measure(sdpa, *inputs(args.heads, tokens, head_dim, dtype))
            for name in args.variants.split(","):
                tda.TUNING = VARIANTS.get(name)
                tensors = inputs(args.heads, tokens, head_dim, dtype, unit=True)
                try:
                    fwd, fwdbwd, peak = measure(tda_two_passes if name == "tda-2pass" else op, *tensors)
                except Exception as error:  # a variant whose tiles do not compile at this head dim
                    print(f"{name:14s} L={tokens:6d} D={head_dim:3d} failed: {type(error).__name__}: "
                          f"{str(error).splitlines()[0][:200]}", flush=True)
                    continue
                finally:
                    tda.TUNING = None
                    del tensors
                    torch.cuda.empty_cache()
                rows.append(dict(variant=name, config=str(VARIANTS.get(name)), seq_len=tokens, head_dim=head_dim,
                                 heads=args.heads, dtype="bfloat16", fwd_ms=fwd, fwdbwd_ms=fwdbwd,
                                 sdpa_fwd_ms=base[0], sdpa_fwdbwd_ms=base[1], peak_mem_bytes=peak,
                                 sdpa_peak_mem_bytes=base[2], device=device, created_at=created))
                print(f"{name:14s} L={tokens:6d} D={head_dim:3d} fwd {fwd:8.3f} ms ({fwd / base[0]:5.2f}x) "
                      f"fwd+bwd {fwdbwd:8.3f} ms ({fwdbwd / base[1]:5.2f}x) "
                      f"mem {peak / 2**20:7.1f} MiB ({peak / base[2]:4.2f}x)", flush=True)
                save(rows, args.out)


def save(rows, out_dir):
    frame = pd.DataFrame(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "tda_variants.parquet", index=False)
    lines = [f"# TDA launch variants vs SDPA (flash, causal): {frame.device.iloc[0]}, bf16, B=1, "
             f"H={frame.heads.iloc[0]}, unit q/k", "", f"Measured {frame.created_at.iloc[0]} by "
             "`benchmarks/tda_variants.py`.", "",
             "| variant | L | D | fwd ms | / SDPA | fwd+bwd ms | / SDPA | peak / SDPA | config |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in frame.itertuples():
        lines.append(f"| {r.variant} | {r.seq_len} | {r.head_dim} | {r.fwd_ms:.2f} | {r.fwd_ms / r.sdpa_fwd_ms:.2f} | "
                     f"{r.fwdbwd_ms:.2f} | {r.fwdbwd_ms / r.sdpa_fwdbwd_ms:.2f} | "
                     f"{r.peak_mem_bytes / r.sdpa_peak_mem_bytes:.2f} | `{r.config}` |")
    (out / "tda_variants.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
