"""The attention ops of a training step at the seeds' training widths, against torch SDPA (flash, causal).

A training batch of the paper models is thousands of short heads: ``--shapes`` gives them as
``batch x heads x tokens x head_dim`` (default: MQMTAR's 128 x 16 x 91 x 32 and MQRAR's 128 x 16 x 83 x 16).
For each mechanism the op the training step records (``get_kernel(mechanism, capturable=True)``: the
training-width kernels of ``kernels/narrow.py`` where they apply, else the op with ``CAPTURE_TUNING``) and the op
that validation and scoring call (``wide``), forward and forward+backward, medians of
``triton.testing.do_bench``, bf16, with the ratio to SDPA on the same shape:

    python benchmarks/narrow_kernels.py --out results/benchmarks

``--variant NAME=JSON`` adds the training-width op of ``kernels/narrow.py`` with ``tuning=JSON``, also at widths
where the capturable path takes another op (e.g. ``'bm32={"bm": 32}'`` for its row block, ``'bd32={"bd": 32}'``
for tiles padded to head dim 32); a NAME that starts with ``wide`` adds the long-context op with that tuning
(``'wide32={"fwd": [32, 32, 4, 2], "bwd": [32, 32, 4, 2]}'``). Writes ``narrow_kernels.parquet`` and ``.md`` with
the device, date, commit and command.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from lengthbench.devices import provenance
from lengthbench.kernels import NARROW_OPS, get_kernel
from lengthbench.leaderboard import frame_markdown

MECHANISMS = "stickbreaking,sieve,sieve-window,entmax,softpick,tra,tda"
PARAMS = {"tra": {"sm_scale": 1.0}, "tda": {"lam": 0.5, "sm_scale": 1.0}}


def inputs(mechanism: str, batch: int, heads: int, tokens: int, head_dim: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    count = 5 if mechanism == "tda" else 3
    tensors = [torch.randn(batch, heads, tokens, head_dim, device="cuda", generator=gen) for _ in range(count)]
    if mechanism in ("tra", "tda"):  # cosine scores: unit queries and keys
        tensors[:-1] = [F.normalize(t, dim=-1) for t in tensors[:-1]]
    return [t.to(torch.bfloat16).requires_grad_() for t in tensors]


def timed(call, tensors) -> tuple[float, float]:
    """(forward ms, forward+backward ms), medians of do_bench."""
    import triton

    grad = torch.randn_like(tensors[0])

    def both():
        out = call(*tensors)
        out.backward(grad)

    with torch.no_grad():
        forward = triton.testing.do_bench(lambda: call(*tensors))
    return forward, triton.testing.do_bench(both, grad_to_none=tensors)


def measure(mechanism: str, shape: tuple[int, int, int, int], variants: dict[str, dict], repeat: int = 1) -> list[dict]:
    """One row per op of ``mechanism`` on ``shape``: the fastest of ``repeat`` rounds, the ops taken in turn in
    each (a shared GPU's slow moments fall on every op alike rather than on one)."""
    from lengthbench.kernels import narrow

    tensors = inputs(mechanism, *shape)
    params = PARAMS.get(mechanism, {})
    calls = {"wide": get_kernel(mechanism), "capturable": get_kernel(mechanism, capturable=True)}
    for name, tuning in variants.items():
        if name.startswith("wide"):  # the long-context op with this tuning
            calls[name] = lambda *t, _op=calls["wide"], _tuning=tuning, **kw: _op(*t, tuning=_tuning, **kw)
        elif mechanism in NARROW_OPS and shape[2] <= narrow.NARROW_MAX_TOKENS:  # the training-width op
            op = getattr(narrow, NARROW_OPS[mechanism])
            calls[name] = lambda *t, _op=op, _tuning=tuning, **kw: _op(*t, tuning=_tuning, **kw)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeat):
        for name, op in calls.items():
            forward, both = timed(lambda *t, _op=op: _op(*t, **params), tensors)
            old = best.get(name, (math.inf, math.inf))
            best[name] = (min(old[0], forward), min(old[1], both))
    return [dict(mechanism=mechanism, op=name, batch=shape[0], heads=shape[1], tokens=shape[2], head_dim=shape[3],
                 narrow=takes_narrow(mechanism, name, shape[2]), fwd_ms=forward, fwd_bwd_ms=both, repeat=repeat)
            for name, (forward, both) in best.items()]


def takes_narrow(mechanism: str, op: str, tokens: int) -> bool:
    """Whether ``op`` (``wide``, ``capturable`` or a variant's name) ran the training-width kernels."""
    from lengthbench import kernels
    from lengthbench.kernels import narrow

    if op.startswith("wide") or mechanism not in NARROW_OPS:
        return False
    if op != "capturable":  # a variant: the training-width op itself
        return tokens <= narrow.NARROW_MAX_TOKENS
    if mechanism in kernels.WIDE_CAPTURE and kernels.CAPTURE_STICK == "wide":
        return False
    return tokens <= narrow.CAPTURE_MAX_TOKENS["entmax" if mechanism == "entmax" else "stick"]


def sdpa_row(shape, repeat: int = 1) -> dict:
    q, k, v = inputs("softmax", *shape)
    times = [timed(lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), [q, k, v]) for _ in range(repeat)]
    forward, both = min(t[0] for t in times), min(t[1] for t in times)
    return dict(mechanism="softmax (SDPA)", op="sdpa", batch=shape[0], heads=shape[1], tokens=shape[2],
                head_dim=shape[3], narrow=False, fwd_ms=forward, fwd_bwd_ms=both)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanisms", default=MECHANISMS)
    parser.add_argument("--shapes", default="128x16x91x32,128x16x83x16", help="batch x heads x tokens x head_dim")
    parser.add_argument("--variant", action="append", default=[], help="NAME=JSON: the training-width op "
                        "with this tuning (kernels/narrow.py's _launch lists the keys)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the ops of a mechanism and shape, "
                        "each op's fastest kept")
    parser.add_argument("--out", default="results/benchmarks")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/narrow_kernels.py needs a CUDA GPU")
    variants = {}
    for item in args.variant:
        name, _, text = item.partition("=")
        variants[name] = json.loads(text)
    rows = []
    for text in args.shapes.split(","):
        shape = tuple(int(part) for part in text.split("x"))
        base = sdpa_row(shape, args.repeat)
        rows.append(base)
        for mechanism in args.mechanisms.split(","):
            for row in measure(mechanism, shape, variants, args.repeat):
                row["fwd_vs_sdpa"] = row["fwd_ms"] / base["fwd_ms"]
                row["fwd_bwd_vs_sdpa"] = row["fwd_bwd_ms"] / base["fwd_bwd_ms"]
                rows.append(row)
                print(f"{text} {mechanism:13s} {row['op']:10s} fwd {row['fwd_ms']:.3f} ms "
                      f"({row['fwd_vs_sdpa']:.2f}x SDPA), fwd+bwd {row['fwd_bwd_ms']:.3f} ms "
                      f"({row['fwd_bwd_vs_sdpa']:.2f}x)", flush=True)
        print(f"{text} SDPA fwd {base['fwd_ms']:.3f} ms, fwd+bwd {base['fwd_bwd_ms']:.3f} ms", flush=True)
    frame = pd.DataFrame(rows)
    for key, value in provenance(torch.device("cuda"), sys.argv).items():
        frame[key] = value
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "narrow_kernels.parquet", index=False)
    first = frame.iloc[0]
    columns = ["mechanism", "op", "batch", "heads", "tokens", "head_dim", "fwd_ms", "fwd_bwd_ms", "fwd_vs_sdpa",
               "fwd_bwd_vs_sdpa"]
    (out / "narrow_kernels.md").write_text(
        "# Attention ops at the training widths\n\n"
        f"{first.device}, {first.created_at}, commit {first.git_sha}: `{first.command}`\n\n"
        "`op`: `capturable`, what the training step records (the training-width kernels of kernels/narrow.py "
        "where they apply); `wide`, what validation and scoring call; `sdpa`, torch SDPA (causal) on the same "
        "shape. Times: medians of triton.testing.do_bench, bf16.\n\n"
        + frame_markdown(frame[columns].fillna(math.nan), ".3f") + "\n")


if __name__ == "__main__":
    main()
