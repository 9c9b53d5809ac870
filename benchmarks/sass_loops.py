"""The machine code of the entmax kernels' inner loops, compiled for a GPU architecture on a machine without one
(sm_90, the H100's and H200's, by default): per kernel and setting, its registers and stack (spills) a thread
and, per loop of its SASS, the loop's length and its most frequent instructions.

    python benchmarks/sass_loops.py --kernels newton,output,start,sample --row-scale both --fold both

Needs Triton with its NVIDIA backend (the wheel ships ptxas, cuobjdump and nvdisasm); no GPU. The kernels are
compiled with the default launch settings of ``launch_config`` for head dim 32 (bf16 q, k, v; no slopes), the
open rows' output pass as scoring launches it (no backward to follow). A pass over all keys is bound by its
arithmetic, so a lever's instructions a score show here before a GPU times it: a loop's length is the
instructions of one key tile for one thread (64 x 64 scores over 128 threads: 32 scores each). ``--out FILE``
also writes the report, with the date, the commit and the command.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

KERNELS = ("newton", "output", "start", "sample")
INTS = {"T", "H", "it0", "max_iter", "sample_min"}
POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "ROWS": "*i32", "COUNT": "*i32", "PEND": "*i32",
            "NCAND": "*i32", "LIST": "*i32", "FLAG": "*i32", "SAT": "*i64"}


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def kernel_specs(name: str, rs: bool, fold: bool):
    """``(jit function, constexprs, options)`` of kernel ``name`` as the forward launches it (``options``:
    warps, stages and a register cap where the launch takes one)."""
    from lengthbench.kernels import _entmax_lists as lists
    from lengthbench.kernels import _entmax_search as search
    from lengthbench.kernels import entmax
    from lengthbench.kernels._entmax_config import launch_config

    config = launch_config(32)
    nbm, nbn, nwarps, nstages = config["newton"]
    common = dict(STRICT=False, HAS_SLOPES=False, HAS_RS=rs, FOLD=fold, DOT_PREC="tf32", D=32, BD=32, XS=0.5)
    first = dict(common, BM=config["bm"], BNS=config["bn_subset"], SUBSET_ITERS=16, PACK=10, C=config["list_size"],
                 PAIRS=config["pairs"], SKIP=False, RESCUE=config["rescue"], MAX_SAT=config["max_sat"], SAMPLE=True,
                 S=config["sample"][0], G=lists._SAMPLE_COARSE)
    if name == "newton":
        return (search._newton_kernel, dict(common, ACC=False, BM=nbm, BN=nbn, LEAN=2, PHASED=True),
                dict(num_warps=nwarps, num_stages=nstages))
    if name == "output":  # the scoring's launch: no backward follows (STORE_U off), registers capped
        cap = getattr(entmax, "_OPEN_OUTPUT_REGS", 0)
        return (entmax._open_output_kernel, dict(common, STORE_U=False, BM=nbm, BN=nbn, POWER=2.0),
                dict(num_warps=nwarps, num_stages=nstages, **({"maxnreg": cap} if cap else {})))
    options = dict(num_warps=config["warps"], num_stages=config["stages"])
    if name == "start":
        return lists._lists_start_kernel, first, options
    return lists._sample_kernel, first, options


def compile_kernel(fn, constexprs: dict, options: dict, arch: int, folder: Path, tag: str):
    """``(resources, sass)``: the compiled kernel's resource line (``cuobjdump``) and its SASS (``nvdisasm``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, kept = {}, {}
    for param in fn.params:
        arg = param.name
        if param.is_constexpr:
            signature[arg] = "constexpr"
            kept[arg] = constexprs[arg]
        elif arg in INTS:
            signature[arg] = "i32"
        elif arg[0].isupper():
            signature[arg] = POINTERS.get(arg, "*fp32")
        else:
            signature[arg] = "fp32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(signature) if signature[arg].startswith("*")}
    source = ASTSource(fn, signature, constexprs=kept, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    cubin = folder / f"{tag}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    usage = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    resources = next((line.split("Resource usage:")[-1].strip() for line in usage.splitlines() if "REG" in line), "")
    sass = subprocess.run([str(tools / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    return resources, sass


def loops(sass: str, least: int = 40) -> list[tuple[int, collections.Counter]]:
    """The loops of a SASS listing (a branch back to a label), at least ``least`` instructions long: ``(length,
    opcode counts)`` each, in the listing's order."""
    instructions, labels, found = [], {}, []
    for line in sass.splitlines():
        match = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if match:
            instructions.append(match.group(1))
            continue
        match = re.match(r"(\.L_x_\d+):", line.strip())
        if match:
            labels[match.group(1)] = len(instructions)
    for end, text in enumerate(instructions):
        match = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", text)
        if match and labels.get(match.group(1), end + 1) <= end:
            body = instructions[labels[match.group(1)]:end + 1]
            if len(body) >= least:
                found.append((len(body), collections.Counter(
                    re.sub(r"^@!?U?P\w+\s+", "", op).split()[0] for op in body)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"some of {', '.join(KERNELS)}")
    parser.add_argument("--row-scale", default="both", choices=["on", "off", "both"])
    parser.add_argument("--fold", default="both", choices=["on", "off", "both"])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (sm_90)")
    parser.add_argument("--top", type=int, default=8, help="instructions shown a loop")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    names = [n for n in args.kernels.split(",") if n]
    unknown = sorted(set(names) - set(KERNELS))
    if unknown or not names:
        return _usage(f"--kernels: unknown {unknown or 'none given'}; choose from {', '.join(KERNELS)}")
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError as error:
        return _usage(f"needs Triton with its NVIDIA backend: {error}")
    choice = {"on": [True], "off": [False], "both": [False, True]}
    from lengthbench.devices import git_sha

    lines = [f"# sm_{args.arch} SASS of the entmax kernels' loops", "",
             f"date: {datetime.now(timezone.utc).strftime('%Y-%m-%d')}", f"commit: {git_sha()}",
             f"command: python {' '.join(sys.argv)}", f"triton: {__import__('triton').__version__}", ""]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for rs in choice[args.row_scale]:
                for fold in choice[args.fold]:
                    fn, constexprs, options = kernel_specs(name, rs, fold)
                    tag = f"{name}_rs{int(rs)}_fold{int(fold)}"
                    resources, sass = compile_kernel(fn, constexprs, options, args.arch, Path(tmp), tag)
                    block = [f"## {name}, row scale {'on' if rs else 'off'}, fold {'on' if fold else 'off'}",
                             f"options: {options}", f"resources: {resources}"]
                    for length, counts in loops(sass):
                        top = ", ".join(f"{op} {n}" for op, n in counts.most_common(args.top))
                        block.append(f"- loop of {length} instructions: {top}")
                    print("\n".join(block + [""]), flush=True)
                    lines += block + [""]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sass_loops_"))
    sys.exit(main())
