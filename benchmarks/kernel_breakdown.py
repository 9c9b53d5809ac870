"""Where a fused op's time goes: the GPU time of each kernel (torch.profiler) of one forward, or one forward
and backward, of a mechanism on random inputs, or of one evaluation sample of the ``paper`` model.

    python benchmarks/kernel_breakdown.py --attns entmax,sieve --scales 1.0,0.2 --out results/kernels/breakdown
    python benchmarks/kernel_breakdown.py --attns entmax,sieve --model mqmtar --pe none --out ...

Random inputs: q, k, v N(0, 1), q and k times ``--scale`` (scores of standard deviation ``scale^2``), B 1,
``--heads`` 16, ``--head-dim`` 32, bf16, causal, at ``--length``. ``--model TASK``: instead, the freshly
initialised ``paper`` model of TASK scoring ``--samples`` samples at ``--length`` through the runner's
Evaluator (as ``benchmarks/eval_time.py``), its attention's kernels among the rest; with ``--runs DIR``, the
newest trained model of each ``--attns`` entry (``attn`` or ``attn:pe``) in the results directory DIR. For the threshold
mechanisms (entmax, sparsemax, sieve and the rescaled entmaxes) the share of rows the list forward finished
from their candidate lists ("listed") is recorded too. ``--entmax-tunings`` profiles each case under each of
several ``kernels/entmax.py`` settings (``TUNING``), e.g. ``'[null, {"alibi_skip": false}]'``. One untimed
warm-up first (compilation). ``--census N``: after the first setting's profile, one more untimed run in which
every list forward's rows are sampled, N a head, by ``benchmarks/row_census.py`` (why rows stay open):
``census.parquet`` (a row per sampled row, ``call`` the list forward's index) and a summary in ``census.md``. Writes ``breakdown.parquet`` and ``breakdown.md`` (kernel, calls, total ms,
share) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from lengthbench.errors import UsageError
from lengthbench.leaderboard import frame_markdown

_LISTED: list[float] = []
_CENSUS: dict = dict(rows=0, records=[], calls=0)


def _record_lists():
    """Wrap the list forward's first stage so each call records its share of listed rows."""
    from lengthbench.kernels import entmax  # noqa: PLC0415 - Triton: only where the kernels run
    inner = entmax._lists_start

    def wrapped(pb, *args, **kwargs):
        result = inner(pb, *args, **kwargs)
        ncand = result[1]
        _LISTED.append(float((ncand > 0).float().mean()))
        if _CENSUS["rows"]:
            from row_census import census  # noqa: PLC0415
            xs, strict = args[0], args[1]
            config = result[5]
            for record in census(pb.q, pb.k, ncand, xs=xs, strict=strict, sm_scale=pb.sm_scale, slopes=pb.slopes,
                                 row_scale=pb.row_scale, bns=config["bn_subset"], size=int(config["list_size"]),
                                 max_sat=int(config["max_sat"]), rows=_CENSUS["rows"], seed=_CENSUS["calls"]):
                _CENSUS["records"].append(dict(call=_CENSUS["calls"], xs=xs, strict=strict, **record))
            _CENSUS["calls"] += 1
        return result

    entmax._lists_start = wrapped
    from lengthbench.kernels import sieve
    sieve._lists_start = wrapped


def _run_census(step, rows: int, attn: str, what: str) -> list[dict]:
    """One more untimed ``step`` with the census on: its records, tagged with the case."""
    _CENSUS.update(rows=rows, records=[], calls=0)
    try:
        step()
        torch.cuda.synchronize()
    finally:
        _CENSUS["rows"] = 0
    return [dict(attn=attn, case=what, **r) for r in _CENSUS["records"]]


def _kernel_table(prof) -> list[dict]:
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = event.self_cuda_time_total
        if device_us > 0:
            rows.append(dict(kernel=event.key[:90], calls=event.count, ms=device_us / 1000))
    total = sum(r["ms"] for r in rows)
    for r in rows:
        r["share"] = r["ms"] / total if total else 0.0
    return sorted(rows, key=lambda r: -r["ms"])


def _random_case(attn, length, heads, head_dim, scale, backward):
    from lengthbench.kernels import get_kernel  # noqa: PLC0415

    fn = get_kernel(attn)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, heads, length, head_dim, device="cuda", generator=gen) for _ in range(4))
    q, k = q * scale, k * scale
    q, k, v, do = (t.to(torch.bfloat16) for t in (q, k, v, do))
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)

    def step():
        if backward:
            fn(q, k, v).backward(do)
        else:
            with torch.no_grad():
                fn(q, k, v)

    return step


def _model_case(task_name, attn, pe, length, samples, runs=None, device="cuda"):
    """A callable that scores ``samples`` samples at ``length``: the fresh ``paper`` model of the task, or the
    newest trained ``task:attn:pe`` model of the results directory ``runs`` (the name in the second value)."""
    from lengthbench.config import build_config  # noqa: PLC0415
    from lengthbench.runner import Evaluator, build_model, load_model, newest_trained_run  # noqa: PLC0415
    from lengthbench.tasks import get_task  # noqa: PLC0415

    if runs:
        run_id = newest_trained_run(runs, task_name, attn, pe)
        model, task, _ = load_model(runs, run_id, device)
        weights = f"trained: {run_id}"
    else:
        task = get_task(task_name)
        config = build_config(task_name, attn, pe, "paper")
        torch.manual_seed(0)
        model = build_model(config, task).to(device)
        weights = "fresh"
    evaluator = Evaluator(model, task, torch.device(device), seed=0)
    return (lambda: evaluator.score(length, samples)), weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attns", default="entmax,sieve")
    parser.add_argument("--scales", default="1.0")
    parser.add_argument("--length", type=int, default=65_536)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--backward", action="store_true", help="forward and backward (random inputs only)")
    parser.add_argument("--model", default="", help="a task: profile its paper model's evaluation instead")
    parser.add_argument("--pe", default="none", help="the model's encoding, unless an --attns entry names it (attn:pe)")
    parser.add_argument("--runs", default="", help="with --model: a results directory; profile its trained models")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--entmax-tunings", default="null",
                        help='JSON: a list of kernels/entmax.py TUNING values (null: the defaults), each case profiled '
                             'under each, e.g. \'[null, {"alibi_skip": false}]\'')
    parser.add_argument("--census", type=int, default=0,
                        help="sample this many rows a head of every list forward (benchmarks/row_census.py)")
    parser.add_argument("--out", default="results/kernels/breakdown")
    args = parser.parse_args()
    try:
        tunings = json.loads(args.entmax_tunings)
    except json.JSONDecodeError as error:
        print(f"error: --entmax-tunings is not JSON ({error})", file=sys.stderr)
        sys.exit(2)
    tunings = tunings if isinstance(tunings, list) else [tunings]
    if args.runs and not args.model:
        parser.error("--runs needs --model (the task of the trained runs)")
    rows = []
    cases = []
    for entry in args.attns.split(","):
        attn, _, pe = entry.partition(":")
        if args.model:
            pe = pe or args.pe
            try:
                step, weights = _model_case(args.model, attn, pe, args.length, args.samples, args.runs)
            except UsageError as error:
                print(f"error: {error}", file=sys.stderr)
                sys.exit(2)
            cases.append((attn, f"{args.model} paper model ({weights}), pe {pe}, {args.samples} sample(s)", step))
        else:
            for scale in args.scales.split(","):
                what = f"random, scale {scale}, {'fwd+bwd' if args.backward else 'fwd'}"
                cases.append((attn, what, _random_case(attn, args.length, args.heads, args.head_dim,
                                                       float(scale), args.backward)))
    _record_lists()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    census_rows: list[dict] = []
    device = torch.cuda.get_device_name()
    from lengthbench.kernels import entmax  # noqa: PLC0415 - Triton: only where the kernels run
    cases = [(attn, what + (f", entmax tuning {json.dumps(tuning)}" if tuning else ""), step, tuning)
             for attn, what, step in cases for tuning in tunings]
    for attn, what, step, tuning in cases:
        entmax.TUNING = tuning
        step()  # warm-up: compilation
        torch.cuda.synchronize()
        _LISTED.clear()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        table = _kernel_table(prof)
        listed = sum(_LISTED) / len(_LISTED) if _LISTED else float("nan")
        total = sum(r["ms"] for r in table)
        print(f"== {attn} ({what}): {total:.2f} ms on the GPU; listed rows {listed:.3f}", flush=True)
        for r in table[:args.top]:
            print(f"   {r['ms']:9.2f} ms {100 * r['share']:5.1f}%  x{r['calls']:<4d} {r['kernel']}", flush=True)
        for r in table:
            rows.append(dict(attn=attn, case=what, tuning=json.dumps(tuning), length=args.length, listed=listed,
                             device=device,
                             created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), **r))
        if args.census and tuning == tunings[0]:
            census_rows += _run_census(step, args.census, attn, what)
    if census_rows:
        from row_census import summary  # noqa: PLC0415
        frame = pd.DataFrame(census_rows)
        frame.to_parquet(out / "census.parquet", index=False)
        text = [f"# Row census: {device}, L {args.length}, {args.census} rows a head a list forward", ""]
        for (attn, what), part in frame.groupby(["attn", "case"], sort=False):
            text += [f"## {attn} ({what})", "", "```", summary(part), "```", ""]
            for call, sub in part.groupby("call"):
                text += [f"call {call}: listed {sub['listed'].mean():.1%}; open rows' support median "
                         f"{sub.loc[~sub['listed'], 'support'].median()}", ""]
        (out / "census.md").write_text("\n".join(text))
        print("\n".join(text), flush=True)
    frame = pd.DataFrame(rows)
    frame.to_parquet(out / "breakdown.parquet", index=False)
    lines = [f"# Kernel breakdown: {device}, L {args.length}", ""]
    for (attn, what), part in frame.groupby(["attn", "case"], sort=False):
        lines += [f"## {attn} ({what}): {part['ms'].sum():.2f} ms, listed rows {part['listed'].iloc[0]:.3f}", "",
                  frame_markdown(part.head(args.top)[["kernel", "calls", "ms", "share"]]),
                  ""]
    (out / "breakdown.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
