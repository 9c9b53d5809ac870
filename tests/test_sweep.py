"""Sweeps: validation before anything runs, resumability, the GPU worker pool, and one real tiny sweep."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import cli

from lengthbench.errors import UsageError
from lengthbench.store import CONTRACT_COLUMNS, run_finished, write_run
from lengthbench.sweep import parse_seeds, plan_cells, plan_sweep, run_sweep, split_list

TINY = {"train_samples": 64, "batch_size": 32, "eval_samples": 8, "val_samples": 8, "max_multiplier": 1,
        "d_model": 16, "n_heads": 2, "ffn": 32, "n_layers": 1, "diagnostics": False}


def fake_rows(config, device="cpu"):
    rows = []
    for multiplier in (1, 2):
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=config.run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed,
                   preset=config.preset, train_length=64, eval_length=64 * multiplier, multiplier=multiplier,
                   device=device, metric="exact_match", score=1.0 / multiplier, config_json=config.to_json())
        rows.append(row)
    return rows


def test_lists_and_seeds():
    assert split_list("copy, 2back") == ["copy", "2back"] and split_list("") == split_list(None) == []
    for text in ("copy,,2back", "copy,", ",copy", [" ", "copy"]):
        with pytest.raises(UsageError, match="has an empty item"):
            split_list(text, "--tasks")
    assert parse_seeds("0,2-4,2") == [0, 2, 3, 4]
    with pytest.raises(UsageError, match="non-negative integers"):
        parse_seeds("1,x")


def test_every_name_is_checked_before_anything_runs(tmp_path, monkeypatch, capsys):
    with pytest.raises(UsageError, match="unknown attention mechanism 'nosuch'; choose from: softmax"):
        plan_sweep(["copy"], ["softmax", "nosuch"], ["rope"], [0])
    store = tmp_path / "store"
    code = cli(monkeypatch, "sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope,nosuchpe",
               "--results", store)
    err = capsys.readouterr().err
    assert code == 2 and "unknown positional encoding 'nosuchpe'" in err and "Traceback" not in err
    assert not store.exists()
    assert cli(monkeypatch, "sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope",
               "--max-multiplier", "3", "--results", store) == 2
    assert "power of two" in capsys.readouterr().err
    assert cli(monkeypatch, "sweep", "--config", tmp_path / "missing.toml") == 2


def test_sweep_file_with_flags_overriding_it(tmp_path, monkeypatch, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(f"""
        tasks = ["copy", "2back"]
        attns = ["softmax"]
        pes = ["rope", "nape"]
        seeds = [0, 1]
        results = "{tmp_path / 'store'}"
        [overrides]
        train_samples = 500
    """))
    assert cli(monkeypatch, "sweep", "--config", path, "--dry-run") == 0
    out = capsys.readouterr()
    assert "8 runs" in out.err and out.out.count("to run") == 8
    assert cli(monkeypatch, "sweep", "--config", path, "--tasks", "copy", "--seeds", "3", "--dry-run") == 0
    out = capsys.readouterr()
    assert "2 runs" in out.err and "/ s3" in out.out
    path.write_text('tasks = ["copy"]\nbogus = 1\n')
    assert cli(monkeypatch, "sweep", "--config", path) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err


def test_finished_cells_are_skipped_and_failures_do_not_stop_the_rest(tmp_path, monkeypatch):
    import lengthbench.runner

    calls = []

    def fake_run_cell(config, results, **kwargs):
        calls.append(config.run_id)
        if config.seed == 1:
            raise RuntimeError("diverged")
        write_run(results, config.run_id, fake_rows(config))
        import pandas as pd

        return pd.DataFrame(fake_rows(config))

    monkeypatch.setattr(lengthbench.runner, "run_cell", fake_run_cell)
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2])
    first = run_sweep(configs, tmp_path / "store", device="cpu")
    assert [o.status for o in first] == ["done", "failed", "done"] and "diverged" in first[1].error
    assert first[0].curve == {1: 1.0, 2: 0.5}
    calls.clear()
    second = run_sweep(configs, tmp_path / "store", device="cpu")
    assert [o.status for o in second] == ["skipped", "failed", "skipped"]
    assert calls == [configs[1].run_id]  # only the unfinished cell runs again
    # A corrupt run file counts as finished and is never rewritten: the summary says it is unreadable.
    corrupt = tmp_path / "store" / "runs" / f"{configs[0].run_id}.parquet"
    corrupt.write_bytes(b"not parquet")
    third = run_sweep(configs[:1], tmp_path / "store", device="cpu")
    assert third[0].status == "skipped" and "unreadable" in third[0].error
    assert corrupt.read_bytes() == b"not parquet"


WORKER = """
import json, os, sys
from lengthbench.store import CONTRACT_COLUMNS, write_run
config = json.loads(sys.argv[2])
if config["seed"] == 1:
    print("worker failed on purpose"); sys.exit(3)
rows = [dict(dict.fromkeys(CONTRACT_COLUMNS), run_id=sys.argv[3], task=config["task"], attn=config["attn"],
             pe=config["pe"], seed=config["seed"], multiplier=m, train_length=64, eval_length=64 * m,
             metric="exact_match", score=1.0 / m,
             device="gpu " + os.environ["CUDA_VISIBLE_DEVICES"]) for m in (1, 2)]
write_run(sys.argv[1], sys.argv[3], rows)
"""


def test_worker_pool_gives_each_worker_one_gpu(tmp_path):
    import pandas as pd

    from lengthbench.store import load_results

    configs = plan_sweep(["copy"], ["softmax"], ["rope", "nape"], [0, 1])
    events = []
    outcomes = run_sweep(configs, tmp_path / "store", slots=["0", "1"],
                         on_event=lambda kind, config, outcome, slot: events.append((kind, slot)),
                         worker_command=lambda config, results: [sys.executable, "-c", WORKER, str(results),
                                                                 config.to_json(), config.run_id])
    assert [o.status for o in outcomes] == ["done", "failed", "done", "failed"]
    assert "exit 3: worker failed on purpose" in outcomes[1].error
    devices = set(load_results(tmp_path / "store")["device"])
    assert devices <= {"gpu 0", "gpu 1"} and {slot for kind, slot in events if kind == "start"} == {"0", "1"}
    assert all((tmp_path / "store" / "logs" / f"{c.run_id}.log").exists() for c in configs)
    assert isinstance(outcomes[0].curve, dict) and pd.notna(outcomes[0].curve[1])


def test_cells_sharing_a_gpu_see_that_gpu_and_split_the_cores(tmp_path, monkeypatch):
    from lengthbench import sweep

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert sweep.gpu_slots("auto", per_gpu=3) == ["0", "1", "0.1", "1.1", "0.2", "1.2"]
    assert sweep.gpu_slots("cpu", per_gpu=3) == [] and sweep.gpu_slots("auto") == ["0", "1"]
    with pytest.raises(UsageError, match="per-gpu"):
        sweep.gpu_slots("auto", per_gpu=0)
    monkeypatch.delenv("LENGTHBENCH_DATA_WORKERS", raising=False)
    configs = plan_sweep(["copy"], ["softmax"], ["rope", "nape", "alibi"], [0])
    script = WORKER.replace('device="gpu " + os.environ["CUDA_VISIBLE_DEVICES"]',
                            'device="gpu " + os.environ["CUDA_VISIBLE_DEVICES"] + " w" '
                            '+ os.environ["LENGTHBENCH_DATA_WORKERS"]')
    outcomes = run_sweep(configs, tmp_path / "store", slots=["0", "0.1", "0.2"],
                         worker_command=lambda config, results: [sys.executable, "-c", script, str(results),
                                                                 config.to_json(), config.run_id])
    from lengthbench.store import load_results

    assert [o.status for o in outcomes] == ["done"] * 3 and {o.slot for o in outcomes} == {"0", "0.1", "0.2"}
    workers = max(1, (os.cpu_count() or 2) // 3 - 1)
    assert set(load_results(tmp_path / "store")["device"]) == {f"gpu 0 w{workers}"}


def test_a_real_tiny_sweep_then_leaderboard(tmp_path, monkeypatch, capsys):
    path = tmp_path / "sweep.json"
    store = tmp_path / "store"
    path.write_text(json.dumps({"cells": ["2back:softmax:rope(factor=1)"], "seeds": [0],
                                "results": str(store), "device": "cpu", "overrides": TINY}))
    assert cli(monkeypatch, "sweep", "--config", path, "--quiet") == 0
    out = capsys.readouterr().out
    assert "1 ran, 0 already in the store" in out
    # the summary names the cell with its parameters, each row whole on one line (a log is no terminal)
    row = next(line for line in out.splitlines() if "2back" in line)
    assert "rope (factor=1)" in row and row.rstrip().endswith("│") and row.count("│") == 9
    config = plan_cells(["2back:softmax:rope(factor=1)"], [0], "smoke", TINY)[0]
    assert run_finished(store, config.run_id)
    # in this process too, each cell writes its plain lines to its log, as the worker pool's cells do
    log = (store / "logs" / f"{config.run_id}.log").read_text()
    assert f"{config.run_id} eval 1x" in log and f"{config.run_id} step" in log
    assert cli(monkeypatch, "sweep", "--config", path, "--quiet") == 0
    assert "0 ran, 1 already in the store" in capsys.readouterr().out
    assert cli(monkeypatch, "leaderboard", "--results", store, "--all") == 0
    assert "| rope (factor=1) | softmax |" in capsys.readouterr().out


def test_explicit_cells_keep_their_order_and_check_names(monkeypatch, capsys):
    from lengthbench.sweep import plan_cells

    configs = plan_cells(["copy:sieve:none", "copy:softmax:rope", "copy:sieve:nope"], [0, 1])
    assert [(c.attn, c.pe, c.seed) for c in configs] == [("sieve", "none", 0), ("sieve", "none", 1),
                                                        ("softmax", "rope", 0), ("softmax", "rope", 1)]
    for bad in (["copy:softmax"], ["copy:nonsense:rope"], []):
        with pytest.raises(UsageError):
            plan_cells(bad, [0])
    assert cli(monkeypatch, "sweep", "--cells", "copy:softmax:rope", "--tasks", "copy", "--dry-run") == 2
    assert "not both" in capsys.readouterr().err


def test_sweep_file_per_gpu_must_be_a_number(tmp_path, monkeypatch, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text('cells = ["copy:softmax:rope"]\nper_gpu = "two"\n')
    assert cli(monkeypatch, "sweep", "--config", path) == 2
    assert "per_gpu must be a whole number" in capsys.readouterr().err


def _interrupt_inside_a_compiled_step():
    """What `timeout -s INT` raised through a torch.compile'd step on the H100: a SystemError whose
    context is the KeyboardInterrupt."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise SystemError("<class 'contextlib.nullcontext'> returned a result with an exception set") from None


@pytest.mark.parametrize("how", ["plain", "compiled"])
def test_an_interrupted_worker_says_so_in_one_line_and_exits_130(how, monkeypatch, capsys):
    """A sweep stopped by Ctrl-C or `timeout -s INT` left a KeyboardInterrupt traceback in each cell's log; inside
    a compiled step the interrupt surfaced as a SystemError and left its traceback."""
    from lengthbench import runner, sweep
    from lengthbench.config import build_config

    def interrupted(*args, **kwargs):
        if how == "compiled":
            _interrupt_inside_a_compiled_step()
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_cell", interrupted)
    config = build_config("2back", "softmax", "nape", "smoke")
    assert sweep._worker_main(["unused-results", config.to_json()]) == 130
    out = capsys.readouterr().out
    assert out.splitlines() == [f"{config.run_id} interrupted: the sweep run again resumes it from its last "
                                f"checkpoint (every {config.checkpoint_every} steps)"]
    assert "Traceback" not in out


@pytest.mark.parametrize("how", ["plain", "compiled"])
def test_an_interrupted_run_says_how_to_resume_and_exits_130(how, tmp_path, monkeypatch, capsys):
    from lengthbench import runner

    def interrupted(*args, **kwargs):
        if how == "compiled":
            _interrupt_inside_a_compiled_step()
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_cell", interrupted)
    code = cli(monkeypatch, "run", "--task", "2back", "--attn", "softmax", "--pe", "nape", "--results", tmp_path)
    captured = capsys.readouterr()
    assert code == 130
    assert "interrupted: rerun the same command to continue (`lengthbench run` needs --resume)" in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_an_error_that_is_not_an_interrupt_keeps_its_traceback(tmp_path, monkeypatch):
    from lengthbench import runner

    def broken(*args, **kwargs):
        raise SystemError("a bug")

    monkeypatch.setattr(runner, "run_cell", broken)
    with pytest.raises(SystemError, match="a bug"):
        cli(monkeypatch, "run", "--task", "2back", "--attn", "softmax", "--pe", "nape", "--results", tmp_path)


def test_a_cell_may_carry_its_mechanisms_and_encodings_parameters(tmp_path, monkeypatch, capsys):
    """the sparse-attention paper's Max Retrieval table has entmax at six alphas: one sweep file, not one file per alpha."""
    from lengthbench.sweep import plan_cells

    configs = plan_cells(["maxretrieval:entmax(alpha=4):none", "maxretrieval:entmax:none",
                          "passkey:tra(kappa=2, power=1.5):rope(factor=1)"], [0], "quick")
    assert [(c.attn, c.attn_params, c.pe, c.pe_params) for c in configs] == [
        ("entmax", {"alpha": 4}, "none", {}), ("entmax", {}, "none", {}),
        ("tra", {"kappa": 2, "power": 1.5}, "rope", {"factor": 1})]
    assert len({c.run_id for c in configs}) == 3
    # a cell's own parameters go over those the overrides give every cell
    merged = plan_cells(["maxretrieval:entmax(alpha=4):none", "maxretrieval:entmax:none"], [0], "quick",
                        {"attn_params": {"alpha": 2.0}})
    assert [c.attn_params for c in merged] == [{"alpha": 4}, {"alpha": 2.0}]
    assert configs[0].cell_name() == "maxretrieval / entmax (alpha=4) + none / s0"
    # checked before anything runs: a parameter the mechanism does not take, a malformed list
    for bad, message in (("maxretrieval:softmax(alpha=4):none", "takes no parameter 'alpha'"),
                         ("maxretrieval:entmax():none", "empty parameter list"),
                         ("maxretrieval:entmax(alpha):none", "takes key=value"),
                         ("maxretrieval:entmax(alpha=4:none", "optionally with parameters")):
        with pytest.raises(UsageError, match=re.escape(message)):
            plan_cells([bad], [0], "quick")
    # on the command line, commas inside the brackets stay with their cell
    assert cli(monkeypatch, "sweep", "--cells", "maxretrieval:entmax(alpha=4, gamma=1):none,copy:softmax:rope",
               "--dry-run", "--results", tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "takes no parameter 'gamma'" in err
    path = tmp_path / "sweep.toml"
    path.write_text('cells = ["maxretrieval:entmax(alpha=16):none", "maxretrieval:sparsemax:none"]\n'
                    'preset = "quick"\n[overrides]\ntrain_length = 16\n')
    assert cli(monkeypatch, "sweep", "--config", path, "--dry-run", "--results", tmp_path / "store") == 0
    assert "entmax (alpha=16)" in capsys.readouterr().out.replace("\n", " ")


def test_stages_precede_their_cell_and_chain_its_weights():
    from lengthbench.sweep import add_stages

    overrides = {**TINY, "init": "torch"}
    cells = plan_cells(["mqrar:softmax:rope", "mqrar:entmax:rope"], [0, 1], "smoke", overrides)
    stages = [{"train_length": 16, "task_params": {"layout": "inline"}, "train_samples": 128},
              {"train_length": 16}]
    configs = add_stages(cells, stages, "smoke", overrides)
    assert len(configs) == 4 * 3
    for first, second, cell in zip(configs[0::3], configs[1::3], configs[2::3], strict=True):
        assert (first.init_from, second.init_from, cell.init_from) == ("", first.run_id, second.run_id)
        assert (first.train_length, first.task_params, first.train_samples) == (16, {"layout": "inline"}, 128)
        assert (second.train_length, second.task_params, second.train_samples) == (16, {}, TINY["train_samples"])
        assert (cell.train_length, cell.task_params) == (64, {})
        assert len({c.attn for c in (first, second, cell)}) == 1 and len({c.seed for c in (first, second, cell)}) == 1
        assert first.init == second.init == cell.init == "torch"
    assert [c.run_id for c in configs[2::3]] != [c.run_id for c in cells]  # the cells now start from their stages
    # another task in a stage, with its own parameters (not the sweep's)
    other = add_stages(cells[:1], [{"task": "mqmtar", "task_params": {"key_tokens": 1}}], "smoke",
                       {**overrides, "task_params": {"num_keys": 8}})
    assert (other[0].task, other[0].task_params) == ("mqmtar", {"key_tokens": 1})
    # a stage's mechanism parameters over the cell's, for that stage only (an annealed Sieve filter)
    sieve = plan_cells(["mqrar:sieve(alpha=1.5):none"], [0], "smoke", overrides)
    wide, narrow, cell = add_stages(sieve, [{"attn_params": {"alpha": 1.1}}, {}], "smoke", overrides)
    assert (wide.attn_params, narrow.attn_params, cell.attn_params) == ({"alpha": 1.1}, {"alpha": 1.5}, {"alpha": 1.5})
    assert cell.init_from == narrow.run_id and narrow.init_from == wide.run_id
    for bad, message in (({"seed": 2}, "stage 1: a stage cannot set 'seed'"),
                         ({"attn_params": {"gamma": 1}}, "stage 1 of mqrar:softmax:rope: attention 'softmax' takes no parameter 'gamma'"),
                         ({"bogus": 1}, "stage 1: unknown configuration field 'bogus'"),
                         ({"task": "nosuch"}, "stage 1 of mqrar:softmax:rope: unknown task 'nosuch'")):
        with pytest.raises(UsageError, match=re.escape(message)):
            add_stages(cells, [bad], "smoke", overrides)


def test_a_failed_stage_fails_the_stages_after_it_unrun(tmp_path, monkeypatch):
    import pandas as pd

    import lengthbench.runner
    from lengthbench.sweep import add_stages

    ran = []

    def fake_run_cell(config, results, **kwargs):
        ran.append(config.run_id)
        if config.seed == 1 and not config.init_from:
            raise RuntimeError("stage 1 diverged")
        write_run(results, config.run_id, fake_rows(config))
        return pd.DataFrame(fake_rows(config))

    monkeypatch.setattr(lengthbench.runner, "run_cell", fake_run_cell)
    configs = add_stages(plan_sweep(["mqrar"], ["softmax"], ["rope"], [0, 1], "smoke", TINY),
                         [{"train_length": 16}], "smoke", TINY)
    outcomes = run_sweep(configs, tmp_path / "store", device="cpu")
    assert [o.status for o in outcomes] == ["done", "done", "failed", "failed"]
    assert "not run: its earlier stage" in outcomes[3].error and configs[3].run_id not in ran


STAGED_WORKER = WORKER.replace('if config["seed"] == 1:', '''if config["init_from"] and not os.path.exists(
        os.path.join(sys.argv[1], "runs", config["init_from"] + ".parquet")):
    print("started before its earlier stage finished"); sys.exit(4)
import time; time.sleep(0.3 if not config["init_from"] else 0)
if False:''')


def test_worker_pool_starts_a_stage_only_after_the_one_before(tmp_path):
    from lengthbench.sweep import add_stages

    configs = add_stages(plan_sweep(["mqrar"], ["softmax"], ["rope", "nape"], [0, 1], "smoke", TINY),
                         [{"train_length": 16}, {"train_length": 32}], "smoke", TINY)
    starts = []
    outcomes = run_sweep(configs, tmp_path / "store", slots=["0", "1", "2"],
                         on_event=lambda kind, config, outcome, slot: starts.append(config.run_id) if kind == "start" else None,
                         worker_command=lambda config, results: [sys.executable, "-c", STAGED_WORKER, str(results),
                                                                 config.to_json(), config.run_id])
    assert [o.status for o in outcomes] == ["done"] * 12, [o.error for o in outcomes]
    assert all(starts.index(c.init_from) < starts.index(c.run_id) for c in configs if c.init_from)


def test_a_real_tiny_curriculum_sweep(tmp_path, monkeypatch, capsys):
    path = tmp_path / "sweep.toml"
    store = tmp_path / "store"
    overrides = "\n".join(f"{k} = {json.dumps(v)}" for k, v in TINY.items())  # (JSON scalars are TOML)
    path.write_text(f'cells = ["mqrar:softmax:rope"]\nresults = "{store}"\ndevice = "cpu"\n'
                    f'[overrides]\n{overrides}\n'
                    '[[stages]]\ntrain_length = 16\ntask_params = {layout = "inline"}\n')
    assert cli(monkeypatch, "sweep", "--config", path, "--dry-run") == 0
    out = capsys.readouterr()
    assert "2 runs (1 listed x 1 seeds, each after 1 earlier stage)" in " ".join(out.err.split())
    assert "(the cell)" in out.out and out.out.count("to run") == 2
    assert cli(monkeypatch, "sweep", "--config", path, "--quiet") == 0
    assert "2 ran, 0 already in the store" in capsys.readouterr().out
    assert cli(monkeypatch, "leaderboard", "--results", store, "--all") == 0
    assert "after mqrar (layout=inline) at n 16" in " ".join(capsys.readouterr().out.split())


CONFIG_FILES = sorted((Path(__file__).resolve().parent.parent / "configs").rglob("*.toml"))  # studies/ too


def test_there_are_reproduction_configs():
    assert len(CONFIG_FILES) >= 10  # a glob that finds nothing would leave the test below with no case


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_every_committed_config_file_plans(path, tmp_path, monkeypatch, capsys):
    """The configs that reproduce the papers' tables (docs/reproduction.md) and the studies beside them
    (configs/studies/) still read and plan: their cells, mechanisms, parameters, variants and stages are all valid
    here, so a rerun from one of them does not fail on its first line."""
    monkeypatch.setenv("COLUMNS", "250")
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path, "--dry-run") == 0
    out = capsys.readouterr().out
    # an empty store: every run is to run (a budgeted file prints its plan: each cell runs or does not fit)
    assert ("to run" in out or " runs " in out or "does not fit" in out) and "in the store" not in out, out[-500:]
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_variants_run_each_cell_once_more_per_change(tmp_path, monkeypatch, capsys):
    """A study: every cell as listed, then once per ``[variants.NAME]`` that applies to it, with the variant's
    fields over the cell's (parameter tables merged), ``[by_task.NAME]`` per task; the plan names the variants."""
    from lengthbench.sweep import configs_of_sweep, read_sweep_file

    path = tmp_path / "study.toml"
    path.write_text(textwrap.dedent('''\
        cells = ["mqrar:stickbreaking:none", "copy:stickbreaking:none", "copy:softmax:rope(factor=1)"]
        seeds = [0, 1]
        preset = "quick"
        [overrides]
        train_samples = 1000
        task_params = {queries = 2}
        [by_task.copy]
        train_samples = 3000
        task_params = {symbols = 8}
        [variants.inline]
        cells = ["mqrar:stickbreaking:none"]
        task_params = {layout = "inline"}
        [variants.drop]
        cells = ["mqrar:stickbreaking:none", "copy:stickbreaking:none"]
        attn_params = {remainder = "drop"}
        [variants.torch-init]
        init = "torch"
        [variants.base-500]
        cells = ["copy:softmax:rope(factor=1)"]
        pe_params = {base = 500}
        '''))
    labels = {}
    settings = read_sweep_file(path)
    with pytest.raises(UsageError, match="queries"):  # the overrides' task_params reach copy too
        configs_of_sweep(settings)
    settings["overrides"]["task_params"] = {}
    settings["by_task"]["mqrar"] = {"task_params": {"queries": 2}}
    configs = configs_of_sweep(settings, labels=labels)
    base, rest = configs[:6], configs[6:]
    assert [(c.task, c.attn, c.seed) for c in base] == [(t, a, s) for t, a in [
        ("mqrar", "stickbreaking"), ("copy", "stickbreaking"), ("copy", "softmax")] for s in (0, 1)]
    assert [c.train_samples for c in base] == [1000, 1000, 3000, 3000, 3000, 3000]
    assert base[0].task_params == {"queries": 2} and base[2].task_params == {"symbols": 8}
    assert not any(c.run_id in labels for c in base)
    named = [(labels[c.run_id], c.task, c.attn) for c in rest]
    assert named == [(name, task, attn) for name, cells in [
        ("inline", [("mqrar", "stickbreaking")]), ("drop", [("mqrar", "stickbreaking"), ("copy", "stickbreaking")]),
        ("torch-init", [("mqrar", "stickbreaking"), ("copy", "stickbreaking"), ("copy", "softmax")]),
        ("base-500", [("copy", "softmax")])]
        for task, attn in cells for _ in (0, 1)]
    inline = rest[0]
    assert inline.task_params == {"queries": 2, "layout": "inline"} and inline.train_samples == 1000
    assert rest[2].attn_params == {"remainder": "drop"} and rest[4].task_params == {"symbols": 8}
    assert rest[-3].init == "torch" and rest[-3].pe_params == {"factor": 1}
    softmax = rest[-1]  # the variant's encoding parameters under the cell's own
    assert softmax.init != "torch" and softmax.pe_params == {"base": 500, "factor": 1}
    assert len({c.run_id for c in configs}) == len(configs) == 6 + 2 + 4 + 6 + 2
    # --cells narrows a variant's own list to the cells given
    narrowed = configs_of_sweep(settings, cells="copy:stickbreaking:none", labels=(labels := {}))
    assert sorted(set(labels.values())) == ["drop", "torch-init"] and len(narrowed) == 2 + 2 + 2
    # the dry run's plan names each variant's runs
    path.write_text(path.read_text().replace('task_params = {queries = 2}', 'task_params = {}')
                    .replace('[variants.inline]', '[by_task.mqrar]\ntask_params = {queries = 2}\n[variants.inline]'))
    monkeypatch.setenv("COLUMNS", "250")
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path / "store", "--dry-run") == 0
    out = capsys.readouterr()
    assert "20 runs (3 listed x 2 seeds, and 14 of 4 variants)" in " ".join(out.err.split())
    assert "mqrar / stickbreaking + none / s1 [inline]" in out.out
    assert "copy / softmax + rope (factor=1) / s0 [torch-init]" in out.out


@pytest.mark.parametrize("text, message", [
    ('cells = ["copy:softmax:rope"]\n[variants.a]\nlr = -1\n', "variants.a: lr"),
    ('cells = ["copy:softmax:rope"]\n[variants.a]\ncells = []\nlr = 0.1\n', "variants.a: cells is empty"),
    ('cells = ["copy:softmax:rope"]\n[variants.a]\ncells = 3\n', "variants.a: cells must be a list"),
    ('tasks = ["copy"]\nattns = ["softmax"]\npes = ["rope"]\n[variants.a]\nlr = 0.1\n', "need a cell list"),
    ('cells = ["copy:softmax:rope"]\n[by_task.copy]\nwarmup_steps = "many"\n', "by_task.copy: warmup_steps"),
    ('cells = ["copy:softmax:rope"]\n[variants.a]\nlr = 0.1\n[[stages]]\ntrain_length = 16\n', "do not combine"),
    ('cells = ["copy:softmax:rope"]\n[variants.a]\nattn_params = {alpha = 2}\n', "variants.a: copy:softmax:rope"),
    ('cells = ["copy:softmax:rope"]\nvariants = 3\n', "[variants.NAME] must be tables"),
])
def test_bad_variants_are_one_line_errors(text, message, tmp_path, monkeypatch, capsys):
    path = tmp_path / "study.toml"
    path.write_text(text)
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path / "store", "--dry-run") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
