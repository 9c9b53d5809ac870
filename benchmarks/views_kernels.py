"""TDA's unit views op (``kernels/views.py``) against the same prologue compiled by Inductor, at the training widths.

For each ``--shapes`` entry ``batch x tokens x heads x head_dim`` (default: the paper MQMTAR, MQRAR and Copy
batches at 128, TDA's two views) and each encoding (``--rope`` on and off), times the forward and the
forward+backward (medians of ``triton.testing.do_bench``, bf16) of: the model's prologue (RoPE, ``F.normalize``,
the copies to ``[B, H, T, D]``) under ``torch.compile``, as the training step compiles it, and the op with its
launch tiles (``default``) and with each ``--variant NAME=JSON`` (``unit_views(tuning=JSON)``, e.g.
``'r64w4={"fwd": [64, 4], "bwd": [64, 4]}'``). Each row also gives the bytes its forward and backward must move
and the bandwidth that makes of its time:

    python benchmarks/views_kernels.py --variant 'r64={"fwd": [64, 4], "bwd": [64, 4]}' --out results/benchmarks

Writes ``views_kernels.parquet`` and ``.md`` with the device, date, commit and command; the kernels' GPU tests are
``tests/test_views.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import torch

from lengthbench.devices import provenance
from lengthbench.leaderboard import frame_markdown

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import parse_variants  # noqa: E402  (benchmarks/kernels.py: --variant NAME=JSON, one-line errors)

SHAPES = "128x91x16x32,128x83x16x16,128x131x16x16"  # the paper MQMTAR, MQRAR and Copy models


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """``BxTxHxD,...`` as tuples; a ``ValueError`` naming the entry that is not four positive integers."""
    shapes = []
    for entry in text.split(","):
        parts = entry.strip().split("x")
        if len(parts) != 4 or not all(part.isdigit() and int(part) > 0 for part in parts):
            raise ValueError(f"--shapes: {entry!r} is not batch x tokens x heads x head_dim (e.g. 128x91x8x32)")
        shapes.append(tuple(int(part) for part in parts))
    return shapes


def prologue(heads: int, head_dim: int, rope: bool, device: str = "cuda"):
    """TDA's own prologue (``TwoViewAttention.views_of``: RoPE, ``unit``), its five tensors made contiguous as the
    op's are (and as the op's call made them before it took the views op): ``(qkv, qk2) -> list``."""
    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.positional import build_pe

    layer = ATTENTION.get("tda")(heads * head_dim, heads, build_pe("rope" if rope else "none", heads, head_dim))
    layer = layer.to(device)

    def call(qkv, qk2):
        ((q1, k1), (q2, k2)), v = layer.views_of(qkv, qk2)
        return [t.contiguous() for t in (q1, k1, q2, k2, v)]

    return call, layer.views_rotation()


def traffic(batch: int, tokens: int, heads: int, head_dim: int) -> tuple[int, int]:
    """Bytes the forward and the backward must move at least (bf16 tensors, fp32 inverse norms)."""
    element = batch * tokens * heads * head_dim * 2
    norms = 4 * batch * heads * tokens * 4
    forward = 5 * element + 5 * element + norms  # qkv and qk2 in; four views and v out; the norms out
    backward = 5 * element + 5 * element + norms + 5 * element  # inputs and five gradients in; dqkv, dqk2 out
    return forward, backward


def measure(shape, rope: bool, variants: dict[str, dict]) -> list[dict]:
    import triton

    from lengthbench.kernels.views import unit_views

    batch, tokens, heads, head_dim = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    qk2 = torch.randn(batch, tokens, 2 * heads * head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    qkv.requires_grad_()
    qk2.requires_grad_()
    reference, inv_freq = prologue(heads, head_dim, rope)
    compiled = torch.compile(reference, dynamic=False)
    calls = {"compiled": lambda: compiled(qkv, qk2)}
    for name, tuning in variants.items():
        calls[name] = lambda tuning=tuning: unit_views(qkv, qk2, heads, inv_freq, tuning)
    grads = [torch.randn(batch, heads, tokens, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
             for _ in range(5)]
    forward_bytes, backward_bytes = traffic(*shape)
    rows = []
    for name, call in calls.items():
        def both(call=call):
            torch.autograd.backward(call(), grads)

        both()  # compiles, and checks the backward runs
        forward = triton.testing.do_bench(call)
        total = triton.testing.do_bench(both, grad_to_none=[qkv, qk2])
        rows.append(dict(batch=batch, tokens=tokens, heads=heads, head_dim=head_dim, rope=rope, path=name,
                         tuning=json.dumps(variants[name]) if variants.get(name) else "",
                         fwd_us=1000 * forward, fwd_bwd_us=1000 * total,
                         fwd_gb_s=forward_bytes / forward / 1e6,
                         bwd_gb_s=backward_bytes / max(total - forward, 1e-6) / 1e6))
    base = next(row for row in rows if row["path"] == "compiled")
    for row in rows:
        row["fwd_bwd_vs_compiled"] = row["fwd_bwd_us"] / base["fwd_bwd_us"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="batch x tokens x heads x head_dim, comma-separated")
    parser.add_argument("--rope", default="on,off", help="on, off or both (on,off): RoPE's rotation in the views")
    parser.add_argument("--variant", action="append", default=[], help="NAME=JSON: the op with tuning=JSON")
    parser.add_argument("--out", type=Path, default=Path("results/views"))
    args = parser.parse_args()
    try:
        shapes = parse_shapes(args.shapes)
        variants = dict(parse_variants(args.variant))  # "default" first, its tuning None
        ropes = [{"on": True, "off": False}[value] for value in args.rope.split(",")]
    except (KeyError, ValueError) as error:
        print(f"error: {error}" if isinstance(error, ValueError) else "error: --rope takes on, off or on,off",
              file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("error: benchmarks/views_kernels.py needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    rows = [row for shape in shapes for rope in ropes for row in measure(shape, rope, variants)]
    frame = pd.DataFrame(rows).assign(**provenance(torch.device("cuda"), sys.argv))
    print(frame_markdown(frame.drop(columns=["command"])), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(args.out / "views_kernels.parquet")
    first = frame.iloc[0]
    (args.out / "views_kernels.md").write_text(
        "# TDA's unit views op against the compiled prologue\n\n"
        f"{first['device']}, {first['created_at']}, commit {first['git_sha']}: `{first['command']}`\n\n"
        "Medians of `triton.testing.do_bench`, bf16, microseconds; `fwd_gb_s`/`bwd_gb_s`: the least bytes the "
        "forward/backward must move over its time (`views_kernels.traffic`); `fwd_bwd_vs_compiled`: the "
        "forward+backward over the compiled prologue's on the same shape.\n\n"
        + frame_markdown(frame.drop(columns=["device", "created_at", "git_sha", "command"])) + "\n")


if __name__ == "__main__":
    main()
