"""The entmax threshold search on wide rows: entmax's forward (and Sieve's, ``--sieve``) and the threshold
alone, each lever variant beside the defaults and SDPA, on the inputs where the search does the most work:
random q and k scaled down (near-uniform rows, supports of hundreds of keys) and the q, k, v that a freshly
initialised ``paper`` model gives at long lengths (every row open: what ``eval_time.py``'s fresh-weight rows
time). Per input and variant it prints the times (medians of ``triton.testing.do_bench``, no gradients), the
largest distance of the threshold from the exact root (``lean`` off, 60 passes) and the kernels' time per
forward (``torch.profiler``, the defaults' forward).

    python benchmarks/entmax_search.py --scales 1,0.45 --fresh mqmtar:entmax --layers 0,3 \\
        --variant 'no-bracket={"bracket": false}' --out results/benchmarks/gpu_logs/entmax_bracket.txt

``--out`` appends the lines, after a header with the device, date, commit and command. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels import inputs, parse_variants
from lengthbench.devices import provenance


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def fresh_qkv(spec: str, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The ``(q, k, v)`` of every attention layer of task ``spec``'s ``paper`` model (``TASK:ATTN``, RoPE),
    freshly initialised (seed 0), on one test sample of nominal length ``tokens`` (bf16 autocast)."""
    from lengthbench.config import build_config
    from lengthbench.models.attention.base import AttentionLayer
    from lengthbench.runner import build_model
    from lengthbench.tasks import get_task

    task_name, _, attn = spec.partition(":")
    task = get_task(task_name)
    torch.manual_seed(0)
    model = build_model(build_config(task_name, attn or "entmax", "rope", "paper"), task).cuda().eval()
    taken = []

    def hook(module, args):
        taken.append(tuple(t.detach().contiguous() for t in module.project(args[0])))

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, AttentionLayer)]
    batch = task.batch(range(1), tokens, "test", 0)
    ids = torch.as_tensor(batch.input_ids[:, :tokens], device="cuda")
    features = None if batch.features is None else torch.as_tensor(batch.features[:, :tokens], device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        model(ids, features)
    for handle in handles:
        handle.remove()
    del model
    torch.cuda.empty_cache()
    return taken


def report(q, k, v, variants, sieve: bool) -> list[str]:
    """The lines of one input: per variant the forward and threshold times, the threshold's error; then the
    defaults' kernels."""
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    from lengthbench.kernels._entmax_search import entmax_threshold
    from lengthbench.kernels.entmax import entmax_attention
    from lengthbench.kernels.sieve import sieve_attention

    exact = entmax_threshold(q, k, max_iter=60, tuning=dict(lean=False))
    finite = torch.isfinite(exact)
    sdpa = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), rep=100)
    lines = []
    for name, tuning in variants:
        fwd = do_bench(lambda t=tuning: entmax_attention(q, k, v, tuning=t), rep=100)
        threshold = do_bench(lambda t=tuning: entmax_threshold(q, k, tuning=t), rep=100)
        err = (entmax_threshold(q, k, tuning=tuning) - exact).abs()[finite].max().item()
        line = (f"  {name:12s} entmax fwd {fwd:7.2f} ms ({fwd / sdpa:.2f}x SDPA {sdpa:.2f}), threshold "
                f"{threshold:7.2f}, |tau - exact| {err:.2e}")
        if sieve:
            ms = do_bench(lambda t=tuning: sieve_attention(q, k, v, tuning=t), rep=100)
            line += f", sieve fwd {ms:7.2f} ({ms / sdpa:.2f}x)"
        lines.append(line)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            entmax_attention(q, k, v)
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:5]
    lines += [f"    {e.key[:40]:40s} {e.self_device_time_total / 3e3:8.2f} ms a forward, {e.count // 3} launches"
              for e in events]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=65_536)
    parser.add_argument("--heads", type=int, default=16, help="random inputs' heads")
    parser.add_argument("--head-dim", type=int, default=32, help="random inputs' head dim")
    parser.add_argument("--scales", default="1,0.45", help="random inputs N(0, 1), q and k times each of these")
    parser.add_argument("--fresh", default="", help="TASK:ATTN: also the q, k, v of that fresh paper model")
    parser.add_argument("--layers", default="0", help="the fresh model's attention layers (from 0)")
    parser.add_argument("--sieve", action="store_true", help="also Sieve's forward (random inputs)")
    parser.add_argument("--variant", action="append", metavar="NAME=JSON",
                        help="launch settings of kernels/_entmax_config.py beside the defaults (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="append the lines to this file")
    args = parser.parse_args()
    variants = parse_variants(args.variant)
    try:
        scales = [float(x) for x in args.scales.split(",") if x]
        layers = [int(x) for x in args.layers.split(",") if x]
    except ValueError as error:
        return _usage(f"--scales / --layers: {error}")
    if args.fresh:
        from lengthbench.config import build_config
        from lengthbench.errors import UsageError

        task_name, _, attn = args.fresh.partition(":")
        try:
            build_config(task_name, attn or "entmax", "rope", "paper")
        except (UsageError, ValueError) as error:
            return _usage(f"--fresh {args.fresh!r}: {error}")
    if not torch.cuda.is_available():
        return _usage("needs a CUDA GPU")
    device = torch.device("cuda")
    prov = provenance(device, sys.argv)
    lines = [f"device: {prov['device']}; date: {prov['created_at']}; commit: {prov['git_sha']}",
             f"command: {prov['command']}"]
    print("\n".join(lines), flush=True)

    def emit(new):
        print("\n".join(new), flush=True)
        lines.extend(new)

    with torch.no_grad():
        for scale in scales:
            q, k, v, _ = (t.detach() for t in inputs(args.heads, args.tokens, args.head_dim, torch.bfloat16,
                                                      scale=scale))
            emit([f"== random N(0, 1) q, k times {scale:g}, L {args.tokens:,}, H {args.heads}, D {args.head_dim}, "
                  "bf16"])
            emit(report(q, k, v, variants, args.sieve))
            del q, k, v
        if args.fresh:
            captured = fresh_qkv(args.fresh, args.tokens)
            for layer in layers:
                if not 0 <= layer < len(captured):
                    return _usage(f"--layers {layer}: the model has {len(captured)} attention layers")
                q, k, v = captured[layer]
                emit([f"== fresh {args.fresh} paper model (RoPE), layer {layer}, q {tuple(q.shape)}"])
                emit(report(q, k, v, variants, False))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as handle:
            handle.write("\n".join(lines) + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
