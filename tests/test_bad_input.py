"""Bad input never reaches a traceback: every command, every failure class, one line on stderr and exit 2.

The table runs each case in-process through the ``lengthbench`` entry point (``cli_helpers.cli``); every
case fails before any training or scoring. Tests run as root here, and root writes through ``chmod``:
an unwritable place is made another way (a path under a regular file, a file where a folder is expected,
a name longer than 255 bytes), and the permission case patches ``os.access`` to say "no" for one folder.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import cli

from lengthbench.store import CONTRACT_COLUMNS, write_run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
LONG = "x" * 300  # longer than any file system's name limit (255 bytes)
B = ["run", "--task", "2back", "--attn", "softmax", "--pe", "nape", "--train-samples", "64", "--eval-samples", "4",
     "--max-multiplier", "2", "--quiet", "--results", "{tmp}/store"]


def _row(run_id: str, multiplier: int) -> dict:
    row = {column: 0.0 for column in CONTRACT_COLUMNS}
    row.update(run_id=run_id, task="copy", attn="softmax", pe="rope", seed=0, preset="smoke", train_length=64,
               eval_length=64 * multiplier, multiplier=multiplier, exact_match=1.0 / multiplier,
               token_accuracy=1.0, n_samples=4, selection="id", train_steps=2, device="cpu",
               lengthbench_version="0", git_sha="0", created_at="2026-01-01T00:00:00+00:00", metric="exact_match",
               score=1.0 / multiplier, config_json="")
    return row


@pytest.fixture
def places(tmp_path):
    """A regular file, a good store, a store with only a foreign Parquet file, a store whose runs/ is a file,
    a sweep file with a bad value, baselines and paper tables."""
    (tmp_path / "file.txt").write_text("not a folder\n")
    write_run(tmp_path / "good", "copy-softmax-rope-smoke-s0-aaaa", [_row("copy-softmax-rope-smoke-s0-aaaa", m)
                                                                      for m in (1, 2)])
    # a store of one's own mechanism only: no row stands for a paper table's cell
    write_run(tmp_path / "mine", "copy-lb-mine-rope-smoke-s0-cccc", [{**_row("copy-lb-mine-rope-smoke-s0-cccc", m),
                                                                      "attn": "lb-mine"} for m in (1, 2)])
    foreign = tmp_path / "foreign" / "runs"
    foreign.mkdir(parents=True)
    pd.DataFrame({"task": ["copy"], "attn": ["softmax"]}).to_parquet(foreign / "partial.parquet")
    (tmp_path / "filerun").mkdir()
    (tmp_path / "filerun" / "runs").write_text("a file where the runs folder belongs\n")
    (tmp_path / "many.toml").write_text('tasks = ["copy"]\nattns = ["softmax"]\npes = ["rope"]\n'
                                        '[overrides]\neval_samples = "many"\n')
    (tmp_path / "bigseed.toml").write_text('tasks = "copy"\nattns = "softmax"\npes = "rope"\nper_gpu = 0\n')
    cell = {"task": "copy", "attn": "softmax", "pe": "rope", "overrides": {"train_samples": 64},
            "curve": {"1": 1.0, "2": 1.0}}
    (tmp_path / "papers.csv").write_text("paper,table,task,attn,pe,multiplier,value\n"
                                         "Sieve Attention,1,copy,softmax,rope,1,abc\n")
    (tmp_path / "base.json").write_text(json.dumps({"cells": [cell]}))
    (tmp_path / "badbase.json").write_text(json.dumps({"cells": [{**cell, "overrides": {"eval_samples": "many"}}]}))
    # stores whose rows hold numbers outside the store's ranges (the second row of the run; "allbad": both)
    for store, column, value in (("nan", "score", float("nan")), ("inf", "score", float("inf")),
                                 ("above", "score", 1.5), ("zero", "multiplier", 0), ("negative", "eval_length", -5),
                                 ("allbad", "token_accuracy", -1.0), ("notask", "task", None),
                                 ("attnnumber", "attn", 5)):
        rows = [_row("copy-softmax-rope-smoke-s0-bbbb", m) for m in (1, 2)]
        for row in rows[1:] if store not in ("allbad", "attnnumber") else rows:
            row[column] = value
            if store == "nan":  # no value at all: the score and the metric's column
                row["exact_match"] = value
        write_run(tmp_path / f"rows-{store}", "copy-softmax-rope-smoke-s0-bbbb", rows)
    # baselines of `check`, each with one thing wrong (the first cell of the committed tiny baseline otherwise)
    tiny = json.loads((Path(__file__).resolve().parents[1] / "results" / "baselines" / "tiny.json").read_text())
    good = tiny["cells"][0]
    hand = {"task": "copy", "attn": "softmax", "pe": "rope", "overrides": {"train_samples": 64}}
    broken = {"task_params": {**good, "config": {**good["config"], "task_params": [1, 2]}},
              "attn_params": {**hand, "overrides": {"attn_params": "alpha=2"}},
              "key3": {**good, "curve": {"1": 0.5, "3": 0.5}}, "key-1": {**good, "curve": {"-1": 0.5}},
              "keyinf": {**good, "curve": {"inf": 0.5}}, "key1e400": {**good, "curve": {"1e400": 0.5}},
              "string": {**good, "curve": {"1": "0.5"}}, "true": {**good, "curve": {"1": True}},
              "negative": {**good, "curve": {"2": -0.25}}, "nan": {**good, "curve": {"1": float("nan")}},
              "fields": {**good, "config": {"task": "2back", "attn": "softmax", "pe": "nape"}},
              "compile": {**good, "config": {**good["config"], "compile": "yes"}},
              "lr": {**good, "config": {**good["config"], "lr": "abc"}},
              "dmodel": {**good, "config": {**good["config"], "d_model": True}},
              "field": {**good, "config": {**good["config"], "warmup": 5}},
              "cellkey": {key: value for key, value in {**hand, "overides": hand["overrides"]}.items()
                          if key != "overrides"},
              "both": {**good, "overrides": {"train_samples": 64}}}
    for name, bad in broken.items():
        (tmp_path / f"b-{name}.json").write_text(json.dumps({"cells": [bad]}))
    (tmp_path / "b-extra.json").write_text(json.dumps({**tiny, "tolerance": 0.2}))
    (tmp_path / "b-taskint.json").write_text(json.dumps({"cells": [{**good, "config": {**good["config"], "task": 5}}]}))
    (tmp_path / "lr.toml").write_text('tasks = "copy"\nattns = "softmax"\npes = "rope"\n[overrides]\nlr = "abc"\n')
    (tmp_path / "stage.toml").write_text('tasks = "copy"\nattns = "softmax"\npes = "rope"\n[[stages]]\n'
                                         'd_model = true\n')
    # special files where a file is written: a FIFO, a link to it, and folders holding one under a file's name
    os.mkfifo(tmp_path / "fifo")
    import socket

    with socket.socket(socket.AF_UNIX) as unix:  # a socket file stays after its socket is closed
        unix.bind(str(tmp_path / "sock"))
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    for folder, names in (("pubfifo", ["leaderboard.md", "paper_comparison.md", "index.html"]),
                          ("pubpair", ["leaderboard.parquet", "paper_comparison.parquet"]),
                          ("plotpair", ["curves_copy.svg"]),
                          ("plotfifo", ["curves_copy.png"]),
                          ("diagfifo", ["diagnostics-copy.png"])):
        (tmp_path / folder).mkdir()
        for name in names:
            os.mkfifo(tmp_path / folder / name)
    # checkpoints: a truncated zip, and bytes that are no zip at all
    import io

    import torch

    from lengthbench.config import build_config

    saved = io.BytesIO()
    torch.save({"config": {}, "model": {"w": torch.zeros(64)}, "state": {}}, saved)
    truncated = saved.getvalue()[: len(saved.getvalue()) // 2]
    for run_id, content in (("cut", truncated), ("text", b"not a checkpoint\n")):
        (tmp_path / "ckpt" / "checkpoints" / run_id).mkdir(parents=True)
        (tmp_path / "ckpt" / "checkpoints" / run_id / "model.pt").write_bytes(content)
    # runs of a plugin's mechanism (recorded) and encoding (not recorded) that is not loaded
    from lengthbench.config import RunConfig

    for run_id, config, plugins in (("plugged", RunConfig("copy", "lb-gone", "rope"), ["lb_gone@/nowhere"]),
                                    ("unnamed", RunConfig("copy", "softmax", "lb-pe-gone"), None)):
        (tmp_path / "ckpt" / "checkpoints" / run_id).mkdir(parents=True)
        torch.save({"config": config.identity(), "model": {}, "state": {"step": 10**9}, "plugins": plugins},
                   tmp_path / "ckpt" / "checkpoints" / run_id / "model.pt")
    config = build_config("2back", "softmax", "nape", "smoke", train_length=64, max_multiplier=2, eval_samples=4,
                          seed=0, train_samples=64)  # the run of B
    for store, name in (("resume", "train.pt"), ("resumed", "model.pt")):
        (tmp_path / store / "checkpoints" / config.run_id).mkdir(parents=True)
        (tmp_path / store / "checkpoints" / config.run_id / name).write_bytes(truncated)
    # checkpoints that load but do not hold what lengthbench wrote: a training state that is text, a configuration
    # that names no mechanism or has a word for a number, no weights
    finished = {"step": 10**9, "train_seconds": 1.0, "best_score": 0.0, "best_step": 1}
    for store, name, saved in (
            ("state-text", "train.pt", {"config": config.identity(), "model": {}, "state": "abc"}),
            ("config-partial", "train.pt", {"config": {"task": "2back"}, "model": {}, "state": {}}),
            ("config-word", "model.pt", {"config": {**config.identity(), "d_model": "big"}, "model": {},
                                         "state": finished}),
            ("no-weights", "model.pt", {"config": config.identity(), "model": {}, "state": finished})):
        folder = tmp_path / store / "checkpoints" / config.run_id
        folder.mkdir(parents=True)
        torch.save(saved, folder / name)
    # B trained, its scoring interrupted: the file of scored lengths, or of a length's tallies, is corrupt
    from lengthbench.checkpoints import build_model
    from lengthbench.tasks import get_task

    model = build_model(config, get_task("2back"))
    for store, name in (("scoring", "eval_rows.json"), ("tallies", "eval_samples_partial.json")):
        folder = tmp_path / store / "checkpoints" / config.run_id
        folder.mkdir(parents=True)
        torch.save({"config": config.identity(), "model": model.state_dict(),
                    "state": {"step": config.train_steps, "train_seconds": 1.0, "best_score": 0.0, "best_step": 1}},
                   folder / "model.pt")
        (folder / name).write_text('[{"multiplier": 1, ')
    # a train.pt with this run's weights and no optimizer state
    folder = tmp_path / "no-optimizer" / "checkpoints" / config.run_id
    folder.mkdir(parents=True)
    torch.save({"config": config.identity(), "model": model.state_dict(), "state": {}}, folder / "train.pt")
    # plugins that fail on import (on sys.path in every case)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "lb_bad_runtime.py").write_text('raise RuntimeError("boom")\n')
    (plugins / "lb_bad_syntax.py").write_text("def broken(:\n")
    (plugins / "lb_bad_key.py").write_text('{}["missing"]\n')
    (plugins / "1-bad.py").write_text("")
    (plugins / "lb_bad_exit.py").write_text("raise SystemExit(3)\n")
    return tmp_path


def run_of_b() -> str:
    """The run id of ``B``'s run."""
    from lengthbench.config import build_config

    return build_config("2back", "softmax", "nape", "smoke", train_length=64, max_multiplier=2, eval_samples=4,
                        seed=0, train_samples=64).run_id


def special_files(folder) -> dict[str, str]:
    """Every FIFO, socket and symlink under ``folder``: what a writer must leave as it is."""
    return {str(path): ("link" if path.is_symlink() else "fifo" if stat.S_ISFIFO(path.lstat().st_mode) else "socket")
            for path in sorted(folder.rglob("*"))
            if path.is_symlink() or stat.S_ISFIFO(path.lstat().st_mode) or stat.S_ISSOCK(path.lstat().st_mode)}


# (id, arguments, the words the one line must hold). {tmp} is the test's folder (see ``places``).
CASES = [
    # -- 1. filesystem errors: checked before any work ---------------------------------------------
    ("run results is a file", [*B[:-1], "{tmp}/file.txt"], "is a file, not a folder"),
    ("run results under a file", [*B[:-1], "{tmp}/file.txt/store"], "is a file, so nothing can be created"),
    ("run results name too long", [*B[:-1], "{tmp}/" + LONG], "longer than 255 bytes"),
    ("run results empty", [*B[:-1], ""], "--results is empty"),
    ("run runs/ is a file", [*B[:-1], "{tmp}/filerun"], "runs is a file, not a folder"),
    ("run runs/ unwritable", [*B[:-1], "{tmp}/good"], "no permission to write in"),
    ("sweep results is a file", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--results",
                                 "{tmp}/file.txt"], "is a file, not a folder"),
    ("sweep results empty", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--results", ""],
     "--results is empty"),
    ("sweep runs/ unwritable", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--results",
                                "{tmp}/good"], "no permission to write in"),
    ("rescore results under a file", ["rescore", "some-run", "--samples", "8", "--results", "{tmp}/file.txt/x"],
     "is a file, so nothing can be created"),
    ("rescore runs/ unwritable", ["rescore", "some-run", "--samples", "8", "--results", "{tmp}/good"],
     "no permission to write in"),
    ("leaderboard out is a folder", ["leaderboard", "--results", "{tmp}/good", "--out", "{tmp}"],
     "is a folder, not a file"),
    ("leaderboard out under a file", ["leaderboard", "--results", "{tmp}/good", "--out", "{tmp}/file.txt/lb.md"],
     "is a file, so nothing can be created"),
    ("leaderboard publish is a file", ["leaderboard", "--results", "{tmp}/good", "--publish", "{tmp}/file.txt"],
     "is a file, not a folder"),
    ("leaderboard out name too long", ["leaderboard", "--results", "{tmp}/good", "--out", "{tmp}/" + LONG],
     "longer than 255 bytes"),
    ("leaderboard results is a file", ["leaderboard", "--results", "{tmp}/file.txt"], "is not a folder"),
    ("compare out is a folder", ["compare", "--results", "{tmp}/good", "--out", "{tmp}"], "is a folder, not a file"),
    ("compare publish under a file", ["compare", "--results", "{tmp}/good", "--publish", "{tmp}/file.txt/p"],
     "is a file, so nothing can be created"),
    ("plot out is a file", ["plot", "--results", "{tmp}/good", "--out", "{tmp}/file.txt"], "is a file, not a folder"),
    ("plot out name too long", ["plot", "--results", "{tmp}/good", "--out", "{tmp}/" + LONG], "longer than 255"),
    ("inspect maps out is a file", ["inspect", "maps", "--run", "r", "--length", "64", "--results", "{tmp}/good",
                                    "--out", "{tmp}/file.txt"], "is a file, not a folder"),
    ("inspect diagnostics out under a file", ["inspect", "diagnostics", "--results", "{tmp}/good", "--out",
                                              "{tmp}/file.txt/d"], "is a file, so nothing can be created"),
    ("check results is a file", ["check", "--baseline", "{tmp}/base.json", "--results", "{tmp}/file.txt"],
     "is a file, not a folder"),
    ("check results unwritable", ["check", "--baseline", "{tmp}/base.json", "--results", "{tmp}/good"],
     "no permission to write in"),
    ("check update baseline is a folder", ["check", "--baseline", "{tmp}/base.json", "--update", "--results",
                                           "{tmp}/scratch", "--baseline", "{tmp}"], "baseline"),
    # -- 2. a store whose files lack the contract's columns ------------------------------------------
    ("leaderboard foreign file", ["leaderboard", "--results", "{tmp}/foreign"], "lacks the columns"),
    ("leaderboard foreign file skipped, nothing left", ["leaderboard", "--results", "{tmp}/foreign",
                                                        "--skip-unreadable"], "the store is empty"),
    ("compare foreign file", ["compare", "--results", "{tmp}/foreign"], "lacks the columns"),
    ("plot foreign file", ["plot", "--results", "{tmp}/foreign", "--out", "{tmp}/plots"], "lacks the columns"),
    ("inspect diagnostics foreign file", ["inspect", "diagnostics", "--results", "{tmp}/foreign", "--out",
                                          "{tmp}/d"], "lacks the columns"),
    ("leaderboard runs/ is a file", ["leaderboard", "--results", "{tmp}/filerun"], "is a file, not the folder"),
    # -- 3. parameters --------------------------------------------------------------------------------
    ("pe-param unknown key", [*B, "--pe-param", "nope=1"], "takes no parameter 'nope'"),
    ("pe-param wrong type", [*B[:6], "rope", *B[7:], "--pe-param", "base=abc"], "must be a number"),
    ("attn-param unknown key", [*B, "--attn-param", "alpha=2"], "takes no parameter 'alpha'"),
    ("batch size 0", [*B, "--batch-size", "0"], "--batch-size must be in [1"),
    ("task param wrong type", [*B, "--param", "symbols=many"], "--param symbols"),
    ("param without =", [*B, "--param", "symbols"], "key=value"),
    # -- 4. ranges ------------------------------------------------------------------------------------
    ("seed -1", [*B, "--seed", "-1"], "--seed must be in [0"),
    ("seed beyond 64 bits", [*B, "--seed", str(2**64)], "--seed must be in [0"),
    ("max multiplier 2**40", [*B[:12], str(2**40), *B[13:]], "--max-multiplier must be in [1, 1,024]"),
    ("max multiplier not a power of two", [*B[:12], "3", *B[13:]], "power of two"),
    ("train length 10**9", [*B, "--train-length", str(10**9), "--dry-run"], "--train-length must be in"),
    ("train length x multiplier", [*B[:12], "1024", *B[13:], "--train-length", "4096", "--dry-run"],
     "longest evaluation length"),
    ("alpha NaN", [*B[:4], "entmax", *B[5:], "--attn-param", "alpha=NaN"], "finite"),
    ("alpha 1", [*B[:4], "entmax", *B[5:], "--attn-param", "alpha=1"], "alpha must be in (1"),
    ("factor Infinity", [*B[:6], "rope", *B[7:], "--pe-param", "factor=Infinity"], "finite"),
    ("base 0", [*B[:6], "rope", *B[7:], "--pe-param", "base=0"], "base must be > 1"),
    ("eps -3", [*B[:4], "softpick", *B[5:], "--attn-param", "eps=-3"], "eps must be > 0"),
    ("lr inf", [*B, "--lr", "inf"], "--lr must be a finite number"),
    ("lr 0", [*B, "--lr", "0"], "--lr must be in (0"),
    ("warmup -1", [*B, "--warmup-steps", "-1"], "--warmup-steps must be in [0"),
    ("eval samples 0", [*B[:10], "0", *B[11:]], "--eval-samples must be in [1"),
    ("train samples -5", [*B[:8], "-5", *B[9:]], "--train-samples must be in [1"),
    ("heads 0", [*B, "--heads", "0"], "--heads must be in [1"),
    ("resume and restart", [*B, "--resume", "--restart"], "not both"),
    ("model too large for memory", [*B, "--d-model", "65536", "--layers", "1024", "--heads", "1", "--ffn", "262144",
                                    "--dry-run"], "needs about"),
    ("d-model not divisible by heads", [*B, "--d-model", "30", "--heads", "4", "--dry-run"], "not divisible"),
    ("task sample length 10**12", ["tasks", "sample", "copy", "--length", str(10**12)], "--length must be in"),
    ("task sample length 0", ["tasks", "sample", "copy", "--length", "0"], "--length must be in"),
    ("task sample count 0", ["tasks", "sample", "copy", "--count", "0"], "--count must be in"),
    ("task sample count huge", ["tasks", "sample", "copy", "--count", str(10**12)], "--count must be in"),
    ("task sample symbols 10**11", ["tasks", "sample", "copy", "--param", f"symbols={10**11}"],
     "--param symbols must be in"),
    ("task sample seed -1", ["tasks", "sample", "copy", "--seed", "-1"], "--seed must be in"),
    ("task sample probability 2", ["tasks", "sample", "flipflop", "--param", "p_write=2"], "p_write must be in"),
    ("task vocab symbols 10**11", ["tasks", "vocab", "copy", "--param", f"symbols={10**11}"], "symbols must be in"),
    ("inspect maps length 10**9", ["inspect", "maps", "--run", "r", "--length", str(10**9), "--results",
                                   "{tmp}/good"], "--length must be in"),
    ("inspect maps sample -1", ["inspect", "maps", "--run", "r", "--length", "64", "--sample", "-1"],
     "--sample must be in"),
    ("sweep seeds 0-100000000", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--seeds",
                                 "0-100000000", "--dry-run", "--results", "{tmp}/s"], "a sweep takes at most"),
    ("sweep seeds backwards", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--seeds", "5-1",
                               "--dry-run", "--results", "{tmp}/s"], "is empty"),
    ("sweep seed beyond 64 bits", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--seeds",
                                   str(2**64), "--dry-run", "--results", "{tmp}/s"], "at most 2**63 - 1"),
    ("sweep per-gpu 0", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--per-gpu", "0",
                         "--results", "{tmp}/s"], "--per-gpu must be in [1"),
    ("sweep max multiplier 3", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope",
                                "--max-multiplier", "3", "--dry-run", "--results", "{tmp}/s"], "power of two"),
    ("sweep cell alpha NaN", ["sweep", "--cells", "copy:entmax(alpha=NaN):rope", "--dry-run", "--results",
                              "{tmp}/s"], "finite"),
    ("sweep cell pe param unknown", ["sweep", "--cells", "copy:softmax:rope(nope=1)", "--dry-run", "--results",
                                     "{tmp}/s"], "takes no parameter 'nope'"),
    ("rescore samples 0", ["rescore", "r", "--samples", "0", "--results", "{tmp}/good"], "--samples must be in"),
    ("rescore max multiplier 5", ["rescore", "r", "--max-multiplier", "5", "--results", "{tmp}/good"],
     "power of two"),
    # -- 6. messages that name the problem --------------------------------------------------------------
    ("sweep file eval_samples many", ["sweep", "--config", "{tmp}/many.toml", "--dry-run", "--results", "{tmp}/s"],
     "eval_samples must be an integer, got 'many'"),
    ("sweep file per_gpu 0", ["sweep", "--config", "{tmp}/bigseed.toml", "--dry-run", "--results", "{tmp}/s"],
     "per_gpu must be in [1"),
    ("check baseline eval_samples many", ["check", "--baseline", "{tmp}/badbase.json"],
     "eval_samples must be an integer, got 'many'"),
    ("leaderboard results empty", ["leaderboard", "--results", ""], "--results is empty"),
    ("plot results empty", ["plot", "--results", "", "--out", "{tmp}/p"], "--results is empty"),
    ("inspect diagnostics results empty", ["inspect", "diagnostics", "--results", "", "--out", "{tmp}/d"],
     "--results is empty"),
    ("inspect maps results empty", ["inspect", "maps", "--run", "r", "--length", "64", "--results", "",
                                    "--out", "{tmp}/m"], "--results is empty"),
    ("sweep config empty", ["sweep", "--config", "", "--dry-run"], "--config is empty"),
    ("check baseline empty", ["check", "--baseline", ""], "--baseline is empty"),
    ("check results empty", ["check", "--baseline", "{tmp}/base.json", "--results", ""], "--results is empty"),
    ("compare paper table value not a number", ["compare", "--results", "{tmp}/good", "--paper-tables",
                                                "{tmp}/papers.csv"], "the value of row 2 is not a number, got 'abc'"),
    ("compare paper tables is a folder", ["compare", "--results", "{tmp}/good", "--paper-tables", "{tmp}"],
     "is not a file"),
    ("check tolerance nan", ["check", "--baseline", "{tmp}/base.json", "--tolerance", "nan"], "--tolerance"),
    ("compare a store of one's own mechanism", ["compare", "--results", "{tmp}/mine"],
     "no run in {tmp}/mine stands for a cell of the paper tables (there: lb-mine); your runs beside a table's "
     "published rows: lengthbench compare --config configs/NAME.toml --results {tmp}/mine"),
    ("compare tolerance -1", ["compare", "--results", "{tmp}/good", "--tolerance", "-1"], "--tolerance"),
    # -- every command: unknown names, missing folders, parser errors --------------------------------------
    ("run unknown task", [*B[:2], "nosuch", *B[3:]], "unknown task"),
    ("run int option not a number", [*B, "--batch-size", "abc"], "valid integer"),
    ("rescore missing run", ["rescore", "nosuch", "--samples", "8", "--results", "{tmp}/good"],
     "no trained model for run 'nosuch'"),
    ("leaderboard missing store", ["leaderboard", "--results", "{tmp}/missing"], "does not exist"),
    ("leaderboard unknown format", ["leaderboard", "--results", "{tmp}/good", "--format", "xml"], "unknown format"),
    ("compare missing store", ["compare", "--results", "{tmp}/missing"], "does not exist"),
    ("plot missing store", ["plot", "--results", "{tmp}/missing", "--out", "{tmp}/p"], "does not exist"),
    ("check missing baseline", ["check", "--baseline", "{tmp}/missing.json"], "does not exist"),
    ("check baseline is a folder", ["check", "--baseline", "{tmp}"], "baseline"),
    ("inspect maps missing run", ["inspect", "maps", "--run", "nosuch", "--length", "64", "--results", "{tmp}/good",
                                  "--out", "{tmp}/m"], "nosuch"),
    ("inspect diagnostics missing store", ["inspect", "diagnostics", "--results", "{tmp}/missing"],
     "does not exist"),
    ("inspect diagnostics no diagnostics", ["inspect", "diagnostics", "--results", "{tmp}/good", "--out",
                                            "{tmp}/d", "--task", "2back"], "no stored rows with task"),
    ("tasks list extra argument", ["tasks", "list", "extra"], "unexpected extra argument"),
    ("tasks params unknown", ["tasks", "params", "nosuch"], "unknown task"),
    ("tasks sample unknown split", ["tasks", "sample", "copy", "--split", "dev"], "unknown split"),
    ("tasks vocab unknown", ["tasks", "vocab", "nosuch"], "unknown task"),
    ("attn list extra argument", ["attn", "list", "extra"], "unexpected extra argument"),
    ("attn params unknown", ["attn", "params", "nosuch"], "unknown attention"),
    ("pe list extra argument", ["pe", "list", "extra"], "unexpected extra argument"),
    ("pe params unknown", ["pe", "params", "nosuch"], "unknown positional encoding"),
    ("unknown command", ["nosuch"], "No such command"),
    # -- special files: an output that is a device, FIFO or socket is refused, never renamed over ----------
    ("leaderboard out is a FIFO", ["leaderboard", "--results", "{tmp}/good", "--out", "{tmp}/fifo"],
     "--out {tmp}/fifo is a FIFO, not a regular file"),
    ("compare --config out is a socket", ["compare", "--results", "{tmp}/good", "--config",
                                          str(CONFIGS / "sieve_table1_copy.toml"), "--out", "{tmp}/sock"],
     "--out {tmp}/sock is a socket, not a regular file"),
    ("leaderboard out links to a FIFO", ["leaderboard", "--results", "{tmp}/good", "--out", "{tmp}/link"],
     "is a FIFO, not a regular file"),
    ("leaderboard parquet out is a FIFO", ["leaderboard", "--results", "{tmp}/good", "--format", "parquet", "--out",
                                       "{tmp}/fifo"], "is a FIFO"),
    ("leaderboard publish holds a FIFO", ["leaderboard", "--results", "{tmp}/good", "--all", "--publish",
                                          "{tmp}/pubfifo"],
     "pubfifo/leaderboard.md is a FIFO"),
    ("leaderboard publish, the second file a FIFO", ["leaderboard", "--results", "{tmp}/good", "--all", "--publish",
                                                     "{tmp}/pubpair"], "pubpair/leaderboard.parquet is a FIFO"),
    ("compare publish, the second file a FIFO", ["compare", "--results", "{tmp}/good", "--publish", "{tmp}/pubpair"],
     "pubpair/paper_comparison.parquet is a FIFO"),
    ("plot out, the SVG a FIFO", ["plot", "--results", "{tmp}/good", "--out", "{tmp}/plotpair"],
     "curves_copy.svg is a FIFO"),
    ("compare out is a FIFO", ["compare", "--results", "{tmp}/good", "--out", "{tmp}/fifo"], "is a FIFO"),
    ("compare publish holds a FIFO", ["compare", "--results", "{tmp}/good", "--publish", "{tmp}/pubfifo"],
     "pubfifo/paper_comparison.md is a FIFO"),
    ("plot out holds a FIFO", ["plot", "--results", "{tmp}/good", "--out", "{tmp}/plotfifo"],
     "curves_copy.png is a FIFO"),
    ("inspect diagnostics out holds a FIFO", ["inspect", "diagnostics", "--results", "{tmp}/good", "--out",
                                              "{tmp}/diagfifo"], "diagnostics-copy.png is a FIFO"),
    ("report html holds a FIFO", ["report", "--html", "{tmp}/pubfifo", "--results", "{tmp}/good", "--all"],
     "pubfifo/index.html is a FIFO"),
    ("check update baseline is a FIFO", ["check", "--baseline", "{tmp}/fifo", "--update"],
     "--baseline {tmp}/fifo is a FIFO"),
    # -- plugins that fail on import, whatever they raise: one line naming the plugin and the error --------
    ("plugin raises RuntimeError", ["--plugin", "lb_bad_runtime", "attn", "list"],
     "cannot import plugin 'lb_bad_runtime': RuntimeError: boom"),
    ("plugin has a SyntaxError", [*B, "--plugin", "lb_bad_syntax"], "'lb_bad_syntax': SyntaxError"),
    ("plugin raises KeyError", ["rescore", "r", "--samples", "8", "--results", "{tmp}/good", "--plugin",
                                "lb_bad_key"], "'lb_bad_key': KeyError: 'missing'"),
    ("plugin raises SystemExit", ["tasks", "list", "--plugin", "lb_bad_exit"],
     "cannot import plugin 'lb_bad_exit': SystemExit: 3"),
    ("plugin raises SystemExit, by file", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope",
                                           "--dry-run", "--results", "{tmp}/s", "--plugin", "{tmp}/plugins/lb_bad_exit.py"],
     "lb_bad_exit.py': SystemExit: 3"),
    ("plugin relative ../x", ["--plugin", "../x", "tasks", "list"], "plugin '../x': no such file or folder"),
    ("plugin relative .foo", [*B, "--plugin", ".foo"], "plugin '.foo' is a relative module name"),
    ("LENGTHBENCH_PLUGINS raises", ["pe", "list"], "'lb_bad_runtime': RuntimeError: boom"),
    ("LENGTHBENCH_PLUGINS relative", ["attn", "list"], "plugin '.foo' is a relative module name"),
    # -- plugins named by module, file or module@folder, on every command; a stored run names its plugin -------
    ("plugin file missing", [*B, "--plugin", "{tmp}/nosuch.py"], "plugin '{tmp}/nosuch.py': no such file or folder"),
    ("plugin module@folder missing", ["attn", "list", "--plugin", "lb_x@{tmp}/nosuch"],
     "plugin 'lb_x@{tmp}/nosuch': the folder '{tmp}/nosuch' does not exist"),
    ("plugin not a .py file", ["tasks", "list", "--plugin", "{tmp}/file.txt"],
     "is neither a .py file nor a package folder"),
    ("plugin module not on the path", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--dry-run",
                                       "--results", "{tmp}/s", "--plugin", "lb_nowhere"],
     "no module of that name on Python's path; give its file (--plugin path/to/lb_nowhere.py) or lb_nowhere@FOLDER"),
    ("plugin file name no module name", ["pe", "list", "--plugin", "{tmp}/plugins/1-bad.py"],
     "'1-bad' is not a module name"),
    ("plugin empty", ["leaderboard", "--results", "{tmp}/good", "--plugin", ""], "--plugin is empty"),
    ("inspect maps of a plugin's run", ["inspect", "maps", "--run", "plugged", "--length", "16", "--results",
                                        "{tmp}/ckpt", "--out", "{tmp}/m"],
     "run plugged uses the mechanism 'lb-gone', which no loaded module registers; load its plugin: --plugin "
     "lb_gone@/nowhere"),
    ("rescore a plugin's run", ["rescore", "plugged", "--samples", "8", "--results", "{tmp}/ckpt"],
     "load its plugin: --plugin lb_gone@/nowhere"),
    ("rescore a run naming no plugin", ["rescore", "unnamed", "--samples", "8", "--results", "{tmp}/ckpt"],
     "uses the encoding 'lb-pe-gone', which no loaded module registers; its rows name no plugin"),
    # -- corrupt checkpoints: the file named, and what to do ---------------------------------------------------
    ("rescore model.pt truncated", ["rescore", "cut", "--samples", "8", "--results", "{tmp}/ckpt"],
     "checkpoint {tmp}/ckpt/checkpoints/cut/model.pt is unreadable"),
    ("rescore model.pt not a zip", ["rescore", "text", "--samples", "8", "--results", "{tmp}/ckpt"],
     "the run's trained model is lost: train the run again"),
    ("inspect maps model.pt truncated", ["inspect", "maps", "--run", "cut", "--length", "64", "--results",
                                         "{tmp}/ckpt", "--out", "{tmp}/m"], "cut/model.pt is unreadable"),
    ("inspect maps model.pt not a zip", ["inspect", "maps", "--run", "text", "--length", "64", "--results",
                                         "{tmp}/ckpt", "--out", "{tmp}/m"], "text/model.pt is unreadable"),
    ("run resume train.pt truncated", [*B[:-1], "{tmp}/resume", "--resume"],
     "train.pt is unreadable (RuntimeError: PytorchStreamReader failed reading zip archive"),
    ("run resume model.pt truncated", [*B[:-1], "{tmp}/resumed", "--resume"],
     "model.pt is unreadable (RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
     "central directory): delete it, or pass --restart"),
    ("run init-from model.pt not a zip", [*B[:-1], "{tmp}/ckpt", "--init-from", "text"],
     "text/model.pt is unreadable (UnpicklingError"),
    ("run resume train.pt state not a table", [*B[:-1], "{tmp}/state-text", "--resume"],
     "train.pt is not a lengthbench checkpoint (its training state is not a table): delete it, or pass --restart"),
    ("run resume train.pt config names no mechanism", [*B[:-1], "{tmp}/config-partial", "--resume"],
     "train.pt holds no usable run configuration (it names no attn, pe)"),
    ("rescore model.pt config d_model a word", ["rescore", "{run_b}", "--samples", "8", "--results",
                                                "{tmp}/config-word"],
     "model.pt holds no usable run configuration (d_model must be an integer, got 'big'): the run's trained model "
     "is lost"),
    ("rescore model.pt without weights", ["rescore", "{run_b}", "--samples", "8", "--results", "{tmp}/no-weights"],
     "model.pt does not hold this run's model (its weights lack embed.weight and"),
    ("inspect maps model.pt without weights", ["inspect", "maps", "--run", "{run_b}", "--length", "64", "--results",
                                               "{tmp}/no-weights", "--out", "{tmp}/m"],
     "model.pt does not hold this run's model"),
    ("run resume train.pt without optimizer", [*B[:-1], "{tmp}/no-optimizer", "--resume"],
     "train.pt does not hold what lengthbench wrote there (KeyError: 'optimizer'): delete it, or pass --restart"),
    ("run resume model.pt without weights", [*B[:-1], "{tmp}/no-weights", "--resume"],
     "model.pt does not hold this run's model (its weights lack embed.weight"),
    # -- baselines of `check`: validated whole before any cell runs --------------------------------------------
    ("check baseline task_params a list", ["check", "--baseline", "{tmp}/b-task_params.json"],
     "task_params must be a table of key = value, got [1, 2]"),
    ("check baseline attn_params a string", ["check", "--baseline", "{tmp}/b-attn_params.json"],
     "attn_params must be a table"),
    ("check baseline curve key 3", ["check", "--baseline", "{tmp}/b-key3.json"],
     "curve key '3' is not a multiplier the cell evaluates (\"1\", \"2\")"),
    ("check baseline curve key -1", ["check", "--baseline", "{tmp}/b-key-1.json"], "curve key '-1' is not"),
    ("check baseline curve key inf", ["check", "--baseline", "{tmp}/b-keyinf.json"], "curve key 'inf' is not"),
    ("check baseline curve key 1e400", ["check", "--baseline", "{tmp}/b-key1e400.json"], "curve key '1e400' is not"),
    ("check baseline score a string", ["check", "--baseline", "{tmp}/b-string.json"],
     "the score '0.5' at 1x is not a fraction in [0, 1]"),
    ("check baseline score true", ["check", "--baseline", "{tmp}/b-true.json"], "the score True at 1x"),
    ("check baseline score negative", ["check", "--baseline", "{tmp}/b-negative.json"], "the score -0.25 at 2x"),
    ("check baseline score NaN", ["check", "--baseline", "{tmp}/b-nan.json"], "the score nan at 1x"),
    ("check baseline config lacks fields", ["check", "--baseline", "{tmp}/b-fields.json"],
     "the configuration lacks the fields seed, preset, train_length"),
    ("check baseline config compile a string", ["check", "--baseline", "{tmp}/b-compile.json"],
     "compile must be true or false, got 'yes'"),
    ("check baseline config unknown field", ["check", "--baseline", "{tmp}/b-field.json"],
     "unknown configuration field 'warmup'"),
    ("check baseline cell key misspelt", ["check", "--baseline", "{tmp}/b-cellkey.json"], "unknown key 'overides'"),
    ("check baseline extra top-level key", ["check", "--baseline", "{tmp}/b-extra.json"],
     "unknown key 'tolerance'; a baseline's keys: format, name, description, device, generated_by, cells"),
    ("check baseline task a number", ["check", "--baseline", "{tmp}/b-taskint.json"], "'task' must be a name, got 5"),
    ("check baseline config and overrides", ["check", "--baseline", "{tmp}/b-both.json"], "not both"),
    # -- error texts that name the problem, not Python's ---------------------------------------------------------
    ("check baseline config lr a string", ["check", "--baseline", "{tmp}/b-lr.json"], "lr must be a number, got 'abc'"),
    ("check baseline config d_model true", ["check", "--baseline", "{tmp}/b-dmodel.json"],
     "d_model must be an integer, got True"),
    ("sweep file lr a string", ["sweep", "--config", "{tmp}/lr.toml", "--dry-run", "--results", "{tmp}/s"],
     "lr must be a number, got 'abc'"),
    # -- store contents: a row outside its schema's ranges stops the command, or is skipped by name --------------
    ("leaderboard row score NaN", ["leaderboard", "--all", "--results", "{tmp}/rows-nan"],
     "1 of 2 rows outside the store's ranges: score nan and exact_match nan (the row has no value)"),
    ("leaderboard row score inf", ["leaderboard", "--all", "--results", "{tmp}/rows-inf"], "score inf"),
    ("compare row score 1.5", ["compare", "--results", "{tmp}/rows-above"], "score 1.5 (must be in [0, 1])"),
    ("plot row multiplier 0", ["plot", "--results", "{tmp}/rows-zero", "--out", "{tmp}/p"],
     "multiplier 0 (must be > 0) (the file is left as it is; pass --skip-unreadable to leave those rows out)"),
    ("leaderboard row eval_length -5", ["leaderboard", "--all", "--results", "{tmp}/rows-negative"],
     "eval_length -5 (must be a whole number >= 1)"),
    ("plot row without a task", ["plot", "--results", "{tmp}/rows-notask", "--out", "{tmp}/p"],
     "1 of 2 rows outside the store's ranges: task missing (the row names no task)"),
    ("compare attn column of numbers", ["compare", "--results", "{tmp}/rows-attnnumber"],
     "column attn holds 5, which is not a name; it is not a lengthbench run file"),
    ("leaderboard every row bad, skipped", ["leaderboard", "--all", "--skip-unreadable", "--results",
                                            "{tmp}/rows-allbad"], "the store is empty"),
    ("leaderboard runs/ unreadable", ["leaderboard", "--all", "--results", "{tmp}/good"],
     "no permission to read {tmp}/good/runs: its runs cannot be listed"),
    ("inspect diagnostics runs/ unreadable", ["inspect", "diagnostics", "--results", "{tmp}/good", "--out",
                                              "{tmp}/d"], "no permission to read"),
    # -- options checked at once: executors' options in a dry run, no GPU before the plan, empty list items -------
    ("sweep device cuda without a GPU", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope",
                                         "--device", "cuda", "--results", "{tmp}/s"], "no CUDA GPU is available"),
    ("sweep dry run slurm time abc", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope",
                                      "--executor", "slurm", "--time", "abc", "--dry-run", "--results", "{tmp}/s"],
     "--time takes minutes"),
    ("sweep dry run ray gpus -1", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--executor",
                                   "ray", "--ray-gpus-per-cell", "-1", "--dry-run", "--results", "{tmp}/s"],
     "--ray-gpus-per-cell must be in [0, 1024], got -1"),
    ("sweep dry run ray cpus nan", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--executor",
                                    "ray", "--ray-cpus-per-cell", "nan", "--dry-run", "--results", "{tmp}/s"],
     "--ray-cpus-per-cell must be a finite number, got nan"),
    ("sweep ray cpus nan", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--executor", "ray",
                            "--ray-cpus-per-cell", "nan", "--results", "{tmp}/s"], "--ray-cpus-per-cell must be a finite"),
    ("sweep status mem lots", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--executor",
                               "slurm", "--mem", "lots", "--status", "--results", "{tmp}/s"], "--mem takes a size"),
    ("sweep tasks empty item", ["sweep", "--tasks", "2back,,copy", "--attns", "softmax", "--pes", "rope",
                                "--dry-run", "--results", "{tmp}/s"], "--tasks '2back,,copy' has an empty item"),
    ("sweep pes trailing comma", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope,", "--dry-run",
                                  "--results", "{tmp}/s"], "--pes 'rope,' has an empty item"),
    ("sweep seeds empty item", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--seeds", "0,,1",
                                "--dry-run", "--results", "{tmp}/s"], "--seeds '0,,1' has an empty item"),
    ("leaderboard task empty item", ["leaderboard", "--results", "{tmp}/good", "--all", "--task", ",copy"],
     "--task ',copy' has an empty item"),
    # -- read-only stores: what only reads them needs read permission, not write ----------------------------------
    ("sweep dry run store unreadable", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope",
                                        "--dry-run", "--results", "{tmp}/good"], "no permission to read"),
    ("sweep status runs/ unreadable", ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope",
                                       "--status", "--results", "{tmp}/good"], "no permission to read"),
    ("run dry run runs/ unreadable", [*B[:-1], "{tmp}/good", "--dry-run"], "no permission to read"),
    ("sweep file stage d_model true", ["sweep", "--config", "{tmp}/stage.toml", "--dry-run", "--results", "{tmp}/s"],
     "stage 1: d_model must be an integer, got True"),
    ("run resume eval_rows.json corrupt", [*B[:-1], "{tmp}/scoring", "--resume"],
     "eval_rows.json is unreadable (Expecting"),
    ("run resume eval_samples_partial.json corrupt", [*B[:-1], "{tmp}/tallies", "--resume"],
     "eval_samples_partial.json is unreadable"),
]
# Cases run as on a machine without a GPU (the lead's GPU machine has one).
NO_GPU = {"sweep device cuda without a GPU"}
# Cases run with these environment variables.
ENVIRONMENT = {"LENGTHBENCH_PLUGINS raises": {"LENGTHBENCH_PLUGINS": "lb_bad_runtime"},
               "LENGTHBENCH_PLUGINS relative": {"LENGTHBENCH_PLUGINS": ".foo"}}
# Cases whose folder is unwritable by permission: ``os.access`` says no for paths ending so.
NO_PERMISSION = {"run runs/ unwritable": "runs", "sweep runs/ unwritable": "runs", "rescore runs/ unwritable": "runs",
                 "check results unwritable": "good", "sweep dry run store unreadable": "good",
                 "sweep status runs/ unreadable": "runs", "run dry run runs/ unreadable": "runs",
                 "leaderboard runs/ unreadable": "runs", "inspect diagnostics runs/ unreadable": "runs"}


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_and_exit_2(case, places, monkeypatch, capsys):
    name, args, words = case
    if name in NO_PERMISSION:  # root writes everywhere: say "no" for this folder only
        real_access, suffix = os.access, NO_PERMISSION[name]
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if str(path).endswith(suffix)
                            else real_access(path, mode, **kw))
    if name in NO_GPU:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for key, value in ENVIRONMENT.get(name, {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(places / "plugins"))
    monkeypatch.chdir(places)
    untouched = special_files(places)
    code = cli(monkeypatch, *[arg.replace("{tmp}", str(places)).replace("{run_b}", run_of_b()) for arg in args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert words.replace("{tmp}", str(places)).lower() in lines[0].lower(), (words, err)
    assert special_files(places) == untouched  # no FIFO or link was replaced by a file
    for folder in ("pubpair", "plotpair"):  # nothing written beside a file that was refused: no half-replaced pair
        assert {path.name for path in (places / folder).iterdir()} <= {"leaderboard.parquet", "paper_comparison.parquet",
                                                                       "curves_copy.svg"}


@pytest.mark.parametrize("what", ["--dry-run", "--status"])
def test_a_read_only_store_can_be_planned_and_its_status_read(what, places, monkeypatch, capsys):
    # no write permission anywhere in the store (root writes anyway: os.access says no, as for a user)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if mode & os.W_OK and "good" in str(path)
                        else real_access(path, mode, **kw))
    sweep = ["sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--results", places / "good"]
    assert cli(monkeypatch, *sweep, what) == 0, capsys.readouterr().err
    assert "copy / softmax + rope / s0" in capsys.readouterr().out
    assert cli(monkeypatch, *sweep) == 2  # a real sweep still needs to write
    assert "no permission to write" in capsys.readouterr().err
    assert cli(monkeypatch, *[a.replace("{tmp}", str(places)) for a in B[:-1]], places / "good", "--dry-run") == 0


@pytest.mark.parametrize("command", [["leaderboard", "--all"], ["compare"], ["plot", "--out", "plots"]])
def test_rows_out_of_range_are_skipped_by_name_and_no_numpy_warning(command, places, monkeypatch, capsys):
    # a row without a value (NaN score and exact match), a score of 1.5, a multiplier of 0 (log2 of it warned)
    for store in ("nan", "above", "zero"):
        for path in (places / f"rows-{store}" / "runs").glob("*.parquet"):
            frame = pd.read_parquet(path)
            frame["run_id"] = f"copy-softmax-rope-smoke-s0-{store}"
            frame.to_parquet(places / "good" / "runs" / f"{store}.parquet")
    monkeypatch.chdir(places)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's "invalid value encountered in log2" fails it
        assert cli(monkeypatch, *command, "--results", places / "good", "--skip-unreadable") == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if line.startswith("warning: skipping 1 of 2 rows of")]
    assert len(skipped) == 3, err
    for store, words in (("nan", "score nan and exact_match nan"), ("above", "score 1.5"), ("zero", "multiplier 0")):
        assert any(f"{store}.parquet" in line and words in line for line in skipped), (store, err)
    assert "RuntimeWarning" not in err


def test_the_table_covers_every_command():
    firsts = {tuple(args[:2]) if args[0] in ("inspect", "tasks", "attn", "pe") else (args[0],)
              for _, args, _ in CASES}
    for command in [("run",), ("sweep",), ("rescore",), ("leaderboard",), ("compare",), ("plot",), ("check",),
                    ("inspect", "maps"), ("inspect", "diagnostics"), ("tasks", "list"), ("tasks", "params"),
                    ("tasks", "sample"), ("tasks", "vocab"), ("attn", "list"), ("attn", "params"), ("pe", "list"),
                    ("pe", "params")]:
        assert command in firsts, command


def test_a_foreign_file_is_skipped_with_its_name_and_the_good_rows_stay(places, monkeypatch, capsys):
    # a partial-column file beside a good run: --skip-unreadable leaves it out by name; the board counts one run
    foreign = places / "good" / "runs" / "partial.parquet"
    pd.DataFrame({"task": ["copy"], "attn": ["softmax"], "multiplier": [1]}).to_parquet(foreign)
    assert cli(monkeypatch, "leaderboard", "--results", places / "good", "--skip-unreadable", "--all") == 0
    captured = capsys.readouterr()
    assert "partial.parquet" in captured.err and "lacks the columns" in captured.err
    assert "from 1 runs" in captured.out
    assert cli(monkeypatch, "leaderboard", "--results", places / "good") == 2  # without: it stops, naming it
    assert "partial.parquet" in capsys.readouterr().err


def test_no_work_starts_when_the_store_cannot_be_written(places, monkeypatch):
    # the run is refused before the runner is reached
    import lengthbench.runner

    monkeypatch.setattr(lengthbench.runner, "run_cell", lambda *a, **k: pytest.fail("run_cell was called"))
    args = [arg.replace("{tmp}", str(places)) for arg in B[:-1]] + [str(places / "filerun")]
    assert cli(monkeypatch, *args) == 2


def test_a_link_to_a_file_is_written_through(tmp_path):
    # the link stays a link; its target gets the new text
    from lengthbench.store import atomic_write_text

    target = tmp_path / "real.md"
    target.write_text("old\n")
    (tmp_path / "link.md").symlink_to(target)
    atomic_write_text(tmp_path / "link.md", "new\n")
    assert (tmp_path / "link.md").is_symlink() and target.read_text() == "new\n"


def test_a_written_file_is_readable_as_the_umask_allows_and_keeps_the_mode_it_replaces(tmp_path):
    # the temporary file renamed into place is not left readable by its owner only
    from lengthbench.store import atomic_write_text

    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "new.md", "new\n")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.md").stat().st_mode) == 0o644
    (tmp_path / "kept.md").write_text("old\n")
    (tmp_path / "kept.md").chmod(0o640)
    atomic_write_text(tmp_path / "kept.md", "new\n")
    assert stat.S_IMODE((tmp_path / "kept.md").stat().st_mode) == 0o640
    assert (tmp_path / "kept.md").read_text() == "new\n"


@pytest.fixture
def gpu_without_cuda(tmp_path, monkeypatch):
    """A machine whose NVIDIA GPU CUDA cannot start (here: what a quitting MPS daemon does to new processes)."""
    import torch

    import lengthbench.devices

    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(lengthbench.devices, "NVIDIA_GPUS", tmp_path / "gpus")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)

    def init():
        raise RuntimeError("Unexpected error from cudaGetDeviceCount(). Error 805: MPS client failed to connect\nmore")

    monkeypatch.setattr(torch.cuda, "init", init)
    return tmp_path / "gpus"


def test_auto_on_a_gpu_cuda_cannot_start_is_an_error_not_the_cpu(gpu_without_cuda, tmp_path, monkeypatch, capsys):
    from lengthbench.devices import resolve_device

    code = cli(monkeypatch, "sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--preset", "smoke",
               "--budget", "5m", "--results", tmp_path / "s")
    printed = capsys.readouterr()
    error = printed.err
    # the one line comes before the budget's plan, which would say it plans for a GPU
    assert code == 2 and not list((tmp_path / "s").glob("runs/*.parquet")) and "plan" not in printed.out + error
    assert ("this machine has an NVIDIA GPU but CUDA does not start (Unexpected error from cudaGetDeviceCount(). "
            "Error 805: MPS client failed to connect); fix that, or pass --device cpu") in " ".join(error.split())
    assert str(resolve_device("cpu")) == "cpu"  # asked for: fine
    for folder in gpu_without_cuda.iterdir():  # no NVIDIA GPU: auto is the CPU, as ever
        folder.rmdir()
    assert str(resolve_device("auto")) == "cpu"
