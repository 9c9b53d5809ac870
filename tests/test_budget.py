"""A sweep's time budget: the cost model's arithmetic, the plan (what fits, a cell that cannot finish is never
started), the guard's clean stop, the CLI's plan and exit codes, and MPS started and stopped with a stand-in."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import cli

from lengthbench.budget import (
    MIN_CALIBRATING_S,
    MIN_PART_S,
    BudgetGuard,
    CellCost,
    CostModel,
    cell_progress,
    on_measured_path,
    parse_budget,
    plan,
    shared_slowdown,
    side_by_side_factor,
)
from lengthbench.config import build_config
from lengthbench.errors import UsageError
from lengthbench.mps import daemon_running, mps_for_sweep
from lengthbench.store import CONTRACT_COLUMNS, write_run
from lengthbench.sweep import auto_per_gpu, plan_sweep, run_sweep


@pytest.mark.parametrize("text, seconds", [("25m", 1500), ("90s", 90), ("1h30m", 5400), ("2h", 7200),
                                           ("1.5m", 90), (25, 1500), ("10min", 600), ("1h 5m 3s", 3903)])
def test_budgets_read_as_seconds(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "25", "-5m", "0m", "m", "5x", True, "99999h", float("nan")])
def test_a_bad_budget_is_one_line(text):
    with pytest.raises(UsageError, match="budget must be"):
        parse_budget(text)


def copy_config(**overrides):
    values = dict(train_samples=1_280_000, batch_size=128, eval_samples=1000, max_multiplier=4, val_samples=100,
                  eval_every=5000, selection="8x")
    values.update(overrides)
    return build_config("copy", "softmax", "rope", "paper", **values)


def write_benchmarks(folder: Path, samples_per_s=20_000.0, warmup_s=30.0, s_per_1000=64.0, device="NVIDIA H200"):
    folder.mkdir(parents=True, exist_ok=True)
    config = copy_config()
    pd.DataFrame([dict(task="copy", attn="softmax", pe="rope", batch_size=128, d_model=config.d_model,
                       layers=config.n_layers, train_step=config.train_step, device=device, commit="abc",
                       created_at="2026-12-01", samples_per_s=samples_per_s, warmup_s=warmup_s,
                       tokens_per_sample=130)]
                 ).to_parquet(folder / "train_throughput.parquet")
    # 64 s per 1,000 samples of 65,536 tokens at the model's own width: 1 ms a sample at 1,024 tokens
    pd.DataFrame([dict(task="copy", attn="softmax", pe="rope", n=65536, s_per_1000=s_per_1000,
                       layers=config.n_layers, d_model=config.d_model, device=device, created_at="2026-12-01")]
                 ).to_parquet(folder / "eval_time.parquet")


def test_the_cost_of_a_cell_from_the_benchmarks(tmp_path):
    write_benchmarks(tmp_path)
    config = copy_config()
    cost = CostModel("NVIDIA H200", benchmarks=tmp_path).cost(config)
    assert cost.train == pytest.approx(10_000 * 128 / 20_000.0)  # 10,000 steps of 128 at 20,000 samples/s
    assert cost.start == pytest.approx(20.0 + 30.0)  # the process, then the measured warm-up
    per_sample = 64.0 / 1000 / 65536  # seconds a sample a token
    # two validations (steps 5,000 and 10,000), 100 samples at 8x (512 tokens)
    assert cost.validation == pytest.approx(2 * 100 * per_sample * 512)
    # 1,000 samples at 64, 128 and 256 tokens, one second of overhead each length
    assert cost.scoring == pytest.approx(sum(1000 * per_sample * n + 1.0 for n in (64, 128, 256)))
    assert cost.total == pytest.approx(cost.start + cost.train + cost.validation + cost.scoring)
    # another selection kept from the same training is scored too: twice the scoring
    twice = CostModel("NVIDIA H200", benchmarks=tmp_path).cost(copy_config(also_select=["id"]))
    assert twice.scoring == pytest.approx(2 * cost.scoring) and twice.train == cost.train
    # another GPU model: 0.9 of the rate, a third more scoring time
    other = CostModel("NVIDIA H100 80GB HBM3", benchmarks=tmp_path).cost(config)
    assert other.train == pytest.approx(cost.train / 0.9)
    assert other.sources == ["training: train_throughput, another GPU x 0.9", "scoring: eval_time"]
    # another task's model: the rate scaled by layers x width x tokens (Reverse: 6 layers, 130 tokens a sample)
    reverse = build_config("reverse", "softmax", "rope", "paper", train_samples=1_280_000)
    scaled = CostModel("NVIDIA H200", benchmarks=tmp_path).cost(reverse)
    from lengthbench.tasks import get_task

    tokens = get_task("reverse").max_tokens(64)
    assert scaled.train == pytest.approx(1_280_000 / (20_000.0 * 2 * 130 / (6 * tokens)))
    assert scaled.sources[0] == "training: train_throughput, scaled from copy"
    # nothing measured: the defaults, which are slow
    bare = CostModel("NVIDIA H200", benchmarks=tmp_path / "none").cost(config)
    assert bare.train > cost.train and bare.sources == ["training: default", "scoring: default"]


def test_the_store_calibrates_the_cost(tmp_path):
    write_benchmarks(tmp_path / "bench")
    config = copy_config()
    rows = []
    for multiplier in (1, 2, 4):
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id="r1", task="copy", attn="softmax", pe="rope", seed=0, train_length=64, multiplier=multiplier,
                   eval_length=64 * multiplier, n_samples=500, eval_seconds=5.0 * multiplier, train_steps=10_000,
                   train_seconds=400.0, device="NVIDIA H200", config_json=config.to_json())
        rows.append(row)
    store = pd.DataFrame(rows)
    cost = CostModel("NVIDIA H200", store, benchmarks=tmp_path / "bench").cost(config)
    assert cost.train == pytest.approx(400.0)  # the stored run: 1.28M samples in 400 s (the benchmark says 64)
    assert cost.validation == 0.0  # inside the stored training seconds
    # 5, 10, 20 s for 500 samples: 1,000 samples take twice as long, plus one second each length
    assert cost.scoring == pytest.approx(2 * (5 + 10 + 20) + 3)
    assert cost.sources == ["training: the store (1 run)", "scoring: the store"]
    # a second run of the same model that took twice as long (it shared its GPU) does not slow the estimate: the
    # plan adds sharing on its own (side_by_side_factor)
    shared = store.assign(run_id="r2", train_seconds=800.0)
    both = CostModel("NVIDIA H200", pd.concat([store, shared]), benchmarks=tmp_path / "bench").cost(config)
    assert both.train == pytest.approx(400.0) and both.sources[0] == "training: the store (2 runs)"
    # another GPU's rows do not calibrate this one
    assert CostModel("NVIDIA H100", store, benchmarks=tmp_path / "bench").cost(config).sources[0].startswith(
        "training: train_throughput")
    # a length whose seconds hold a one-time start (the first length's compilation: 30 s) costs a sample no more
    # than the run's longer lengths do (10 s for 500 samples at 128 tokens)
    started = store.assign(eval_seconds=store["eval_seconds"].where(store["multiplier"] != 1, 30.0))
    model = CostModel("NVIDIA H200", started, benchmarks=tmp_path / "bench")
    assert model.seconds_per_sample(config, 64) == (pytest.approx(10.0 / 500), "the store")
    assert model.seconds_per_sample(config, 128) == (pytest.approx(10.0 / 500), "the store")
    assert model.cost(config).scoring == pytest.approx(2 * (10 + 10 + 20) + 3)


def test_a_short_stored_run_gives_way_to_the_benchmark(tmp_path):
    """A run that trained under MIN_CALIBRATING_S spent much of it starting (compilation, graph capture): its rate
    says little of a long cell's, so the throughput benchmark's comes first, and the short run only where no
    benchmark matches (still before the default); a long run of the model sets the rate whatever is shorter."""
    bench = tmp_path / "bench"
    write_benchmarks(bench)  # 20,000 samples/s, 30 s warm-up
    config = copy_config(train_samples=12_800_000)  # 100,000 steps
    short = store_rows(config, 5_000, 60.0, [64, 128, 256], lambda n: n / 64, n_samples=500, device="NVIDIA H200")
    cost = CostModel("NVIDIA H200", short, benchmarks=bench).cost(config)
    assert cost.sources[0] == "training: train_throughput"
    assert cost.train == pytest.approx(12_800_000 / 20_000.0) and cost.start == pytest.approx(20.0 + 30.0)
    assert cost.sources[1] == "scoring: the store"  # its scoring still measures the model's
    # no benchmark for this model: the short run, not the default (10,000 samples/s)
    alone = CostModel("NVIDIA H200", short, benchmarks=tmp_path / "none").cost(config)
    assert alone.sources[0] == f"training: the store (1 run shorter than {MIN_CALIBRATING_S / 60:.0f} min)"
    assert alone.train == pytest.approx(12_800_000 / (5_000 * 128 / 60.0))
    # a run that trained MIN_CALIBRATING_S (as if alone) sets it, the short one beside it left out
    long = store_rows(copy_config(train_samples=12_800_000, seed=1), 50_000, MIN_CALIBRATING_S, [64],
                      lambda n: 1.0, device="NVIDIA H200")
    both = CostModel("NVIDIA H200", pd.concat([short, long]), benchmarks=bench).cost(config)
    assert both.sources[0] == "training: the store (1 run)"
    assert both.train == pytest.approx(12_800_000 / (50_000 * 128 / MIN_CALIBRATING_S))
    # the share of its GPU it recorded counts: 200 s at half speed is 100 s alone, short
    shared = long.assign(train_seconds=200.0, train_gpu_share=2.0)
    pd.DataFrame([dict(d_model=256, cells=2, mps=True, slowdown=2.0)]).to_parquet(bench / "side_by_side.parquet")
    assert CostModel("NVIDIA H200", shared, benchmarks=bench).cost(config).sources[0] == "training: train_throughput"


def test_a_run_that_shared_its_gpu_is_costed_as_if_alone(tmp_path):
    """A stored run that recorded two processes on its GPU (train_gpu_share, gpu_share) trained and scored 1.8x
    slower than alone (the measured slowdown under MPS): the estimate divides that out, and the plan multiplies
    its own sharing back; a store without the columns reads as alone."""
    bench = tmp_path / "bench"
    write_benchmarks(bench)
    pd.DataFrame([dict(d_model=256, cells=2, mps=True, slowdown=1.8), dict(d_model=256, cells=3, mps=True,
                                                                          slowdown=2.7)]).to_parquet(
        bench / "side_by_side.parquet")
    config = copy_config()
    rows = store_rows(config, 10_000, 720.0, [64, 128, 256], lambda n: 0.9 * n / 64, n_samples=500,
                      device="NVIDIA H200")
    alone = CostModel("NVIDIA H200", rows, benchmarks=bench).cost(config)
    assert alone.train == pytest.approx(720.0)
    shared = rows.assign(train_gpu_share=2.0, gpu_share=2.0)
    cost = CostModel("NVIDIA H200", shared, benchmarks=bench).cost(config)
    assert cost.train == pytest.approx(400.0)  # 720 s at 1.8x slower
    assert cost.scoring == pytest.approx(alone.scoring / 1.8 + 3 * (1 - 1 / 1.8))  # the per-length second stays
    assert plan([config], 10_000, 1, 2, True, CostModel("NVIDIA H200", shared, benchmarks=bench))[0].seconds == \
        pytest.approx(1.8 * cost.total)
    # a share between whole numbers of cells: between their slowdowns
    assert shared_slowdown(256, 2.5, bench) == pytest.approx(2.25)
    assert shared_slowdown(256, 1.5, bench) == pytest.approx(1.4)
    assert shared_slowdown(256, 1.0, bench) == shared_slowdown(256, float("nan"), bench) == 1.0
    assert shared_slowdown(256, 4.0, bench) == 4.0  # not measured at 4: as slow as one after another


def test_the_guard_learns_from_the_cells_the_sweep_has_just_stored(tmp_path):
    """A model's first cell, costed by a default, measures the model for the seeds after it: a seed that the
    default said would not fit any more is admitted once the first seed's row says how fast the model trains."""
    first, second = copy_config(seed=0), copy_config(seed=1)
    store = tmp_path / "store"
    cost = CostModel("NVIDIA H200", benchmarks=tmp_path / "none", results=store)
    default = cost.cost(second).total
    assert cost.cost(second).sources == ["training: default", "scoring: default"]
    now = [0.0]
    guard = BudgetGuard(1.5 * default, cost, 1, False, clock=lambda: now[0])
    assert guard.admits(first)
    rows = []
    for multiplier in (1, 2, 4):
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=first.run_id, task="copy", attn="softmax", pe="rope", seed=0, train_length=64,
                   multiplier=multiplier, eval_length=64 * multiplier, n_samples=1000, eval_seconds=1.0,
                   train_steps=first.train_steps, train_seconds=20.0, device="NVIDIA H200",
                   config_json=first.to_json(), exact_match=1.0, token_accuracy=1.0)
        rows.append(row)
    write_run(store, first.run_id, rows)
    now[0] = 0.6 * default  # by the default, the second seed would end at 1.6x: past the budget
    assert guard.admits(second)
    assert cost.cost(second).sources[0] == "training: the store (1 run shorter than 5 min)"
    assert cost.cost(second).total < 0.5 * default
    assert cost.learn() == []  # nothing new since


@pytest.mark.parametrize("attn, params, measured", [
    ("entmax", {"alpha": 1.5}, True), ("entmax", {"alpha": 1.1}, False), ("sieve", {"alpha": 1.1}, False),
    ("sieve", {"remainder": "diagonal"}, True),  # Sieve's fused op computes both remainders
    ("stickbreaking", {"remainder": "drop"}, False), ("asentmax", {"alpha": 1.25}, False),
    ("ssmax", {"s_init": 1.0}, True), ("sieve-window", {"eps": 8}, True), ("softmax", {}, True)])
def test_parameters_that_leave_the_fused_op_are_not_costed_as_measured(attn, params, measured):
    config = build_config("copy", attn, "rope" if attn in ("entmax", "asentmax", "ssmax", "softmax") else "none",
                          "paper", attn_params=params)
    assert on_measured_path(config) is measured


def store_rows(config, steps, train_seconds, lengths, eval_seconds, n_samples=200, device="NVIDIA H100 80GB HBM3"):
    rows = []
    for n in lengths:
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=config.run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed,
                   train_length=config.train_length, multiplier=n // config.train_length, eval_length=n,
                   n_samples=n_samples, eval_seconds=eval_seconds(n), train_steps=steps, train_seconds=train_seconds,
                   device=device, config_json=config.to_json())
        rows.append(row)
    return pd.DataFrame(rows)


def test_a_cell_on_the_reference_path_is_costed_as_one(tmp_path):
    """Sieve at alpha 1.1 has no fused op: the tables' fused rate (20,000 samples/s here) does not apply; stored
    runs of the same mechanism and parameters on another task do, scaled, else the reference path's defaults."""
    from lengthbench.budget import DEFAULT_REFERENCE_SAMPLES_PER_S, REFERENCE_QUADRATIC_FROM
    from lengthbench.tasks import get_task

    write_benchmarks(tmp_path, device="NVIDIA H100 80GB HBM3")
    bench = pd.read_parquet(tmp_path / "train_throughput.parquet").assign(attn="sieve", pe="none")
    bench.to_parquet(tmp_path / "train_throughput.parquet")
    gpu = "NVIDIA H100 80GB HBM3"
    fused = build_config("copy", "sieve", "none", "paper", train_samples=1_280_000, max_multiplier=256)
    assert CostModel(gpu, benchmarks=tmp_path).cost(fused).train == pytest.approx(1_280_000 / 20_000)
    slow = build_config("copy", "sieve", "none", "paper", train_samples=1_280_000, max_multiplier=256,
                        attn_params={"alpha": 1.1})
    cost = CostModel(gpu, benchmarks=tmp_path).cost(slow)
    assert cost.train == pytest.approx(1_280_000 / DEFAULT_REFERENCE_SAMPLES_PER_S)
    assert cost.sources == ["training: default (no fused op for these parameters)", "scoring: default (no fused op)"]
    # the validations at 8x count (a fused cell's are small), and scoring grows with the square past 4,096 tokens
    assert cost.validation > 0
    model = CostModel(gpu, benchmarks=tmp_path)
    long, short = (model.seconds_per_sample(slow, n)[0] for n in (16384, REFERENCE_QUADRATIC_FROM))
    assert long == pytest.approx(short * 16)
    # a stored MQRAR run of Sieve at alpha 1.1 (2 layers, d 256, n 16): its rate, scaled by the work of a sample
    mqrar = build_config("mqrar", "sieve", "none", "paper", attn_params={"alpha": 1.1}, n_layers=2, d_model=256,
                         train_length=16, n_heads=16)
    store = store_rows(mqrar, 10_000, 400.0, [16, 32], lambda n: n / 100)
    cost = CostModel(gpu, store, benchmarks=tmp_path).cost(slow)
    work = {c.task: c.n_layers * c.d_model * get_task(c.task).max_tokens(c.train_length) for c in (mqrar, slow)}
    assert cost.train == pytest.approx(1_280_000 / (10_000 * 128 / 400.0 * work["mqrar"] / work["copy"]))
    assert cost.sources[0] == "training: the store, scaled from mqrar (no fused op for these parameters)"
    # scoring from its longest length (32 tokens, 0.32 s for 200 samples), with the square beyond it
    per_sample = 0.32 / 200 * (slow.n_layers * slow.d_model) / (2 * 256)
    assert CostModel(gpu, store, benchmarks=tmp_path).seconds_per_sample(slow, 64)[0] == pytest.approx(per_sample * 4)
    # the same parameters on the fused op's alpha (1.5) are costed as measured
    assert CostModel(gpu, store, benchmarks=tmp_path).cost(fused).train == pytest.approx(1_280_000 / 20_000)


class FixedCost:
    """A cost model of given seconds per seed."""

    benchmarks = Path("/nonexistent")

    def __init__(self, seconds):
        self.seconds = seconds

    def cost(self, config):
        return CellCost(0.0, self.seconds[config.seed], 0.0, 0.0, ["fixed"])

    def learn(self):
        return []


def test_the_plan_stops_at_the_first_cell_that_cannot_finish():
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2, 3])
    cost = FixedCost({0: 600, 1: 600, 2: 400, 3: 60})
    planned = plan(configs, 1500, 1, 1, False, cost)
    assert [c.state for c in planned] == ["runs", "runs", "does not fit", "does not fit"]
    assert [c.start for c in planned[:2]] == [0, 600]
    # a cell ending exactly at the budget fits; the 60-second cell after a refused one is not started either
    assert [c.state for c in plan(configs, 1600, 1, 1, False, cost)] == ["runs", "runs", "runs", "does not fit"]
    # cells in the store cost nothing and start nothing
    planned = plan(configs, 1500, 1, 1, False, cost, finished=[configs[0].run_id])
    assert [c.state for c in planned] == ["in the store", "runs", "runs", "runs"]
    # two slots: side by side, each slower by the factor (no measurement: as slow as one after another)
    planned = plan(configs, 1500, 2, 2, False, cost)
    assert [c.seconds for c in planned] == [1200, 1200, 800, 120]
    assert [c.state for c in planned] == ["runs", "runs", "does not fit", "does not fit"]


def test_side_by_side_factor_from_the_measurement(tmp_path):
    config = copy_config()
    assert side_by_side_factor(config, 1, True, tmp_path) == 1.0
    assert side_by_side_factor(config, 3, True, tmp_path) == 3.0  # nothing measured: no gain
    pd.DataFrame([dict(d_model=256, cells=3, mps=True, slowdown=1.5), dict(d_model=256, cells=3, mps=False,
                                                                          slowdown=1.8),
                  dict(d_model=512, cells=3, mps=True, slowdown=2.7)]).to_parquet(tmp_path / "side_by_side.parquet")
    assert side_by_side_factor(config, 3, True, tmp_path) == 1.5
    assert side_by_side_factor(config, 3, False, tmp_path) == 1.8
    assert side_by_side_factor(build_config("mqmtar", "softmax", "rope", "paper"), 3, True, tmp_path) == 2.7
    assert side_by_side_factor(config, 2, True, tmp_path) == 2.0  # not measured at 2


def test_the_guard_refuses_once_and_for_all():
    now = [0.0]
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2])
    guard = BudgetGuard(1000, FixedCost({0: 500, 1: 600, 2: 10}), 1, False, clock=lambda: now[0])
    assert guard.admits(configs[0])
    now[0] = 500
    assert not guard.admits(configs[1])  # 500 + 600 > 1000
    assert not guard.admits(configs[2]) and guard.stopped_at == configs[1]  # stopped: nothing else starts


def test_a_cell_longer_than_the_budget_runs_a_part_as_the_first_cell_only():
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2])
    cost = FixedCost({0: 5000, 1: 100, 2: 5000})
    planned = plan(configs, 1500, 1, 1, False, cost)
    # the first runs to the budget's end (its estimate shown whole); nothing fits after it
    assert [c.state for c in planned] == ["runs part", "does not fit", "does not fit"]
    assert planned[0].seconds == 5000 and planned[0].end == 1500
    # not first: it does not fit, and the plan stops there as for any other cell
    planned = plan(configs[1:], 1500, 1, 1, False, cost)
    assert [c.state for c in planned] == ["runs", "does not fit"]
    # first after the cells in the store
    planned = plan(configs, 1500, 1, 1, False, cost, finished=[configs[0].run_id, configs[1].run_id])
    assert [c.state for c in planned] == ["in the store", "in the store", "runs part"]
    # a budget shorter than MIN_PART_S runs no part: the start would take most of it
    assert plan(configs, MIN_PART_S - 1, 1, 1, False, cost)[0].state == "does not fit"
    # the guard agrees: the first cell asked about is admitted with the deadline, a later long one is not
    now = [0.0]
    guard = BudgetGuard(1500, cost, 1, False, clock=lambda: now[0])
    assert guard.admits(configs[0]) and guard.stop_at(configs[0]) == 1500
    now[0] = 1500
    assert not guard.admits(configs[1])
    guard = BudgetGuard(1500, cost, 1, False, clock=lambda: now[0])
    assert guard.admits(configs[1]) and guard.stop_at(configs[1]) is None  # fits: no deadline
    assert not guard.admits(configs[2]) and guard.stop_at(configs[2]) is None


def test_fill_runs_a_part_in_the_budgets_tail_where_five_minutes_are_left():
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2, 3])
    cost = FixedCost({0: 600, 1: 600, 2: 400, 3: 60})
    # without fill the tail (300 s) stays idle; with it the third cell runs there and the fourth does not fit
    assert [c.state for c in plan(configs, 1500, 1, 1, False, cost)] == ["runs", "runs", "does not fit",
                                                                        "does not fit"]
    planned = plan(configs, 1500, 1, 1, False, cost, fill=True)
    assert [c.state for c in planned] == ["runs", "runs", "runs part", "does not fit"]
    assert planned[2].start == 1200 and planned[2].end == 1500 and planned[2].seconds == 400
    # less than MIN_PART_S left: no part
    assert [c.state for c in plan(configs, 1200 + MIN_PART_S - 1, 1, 1, False, cost, fill=True)] == [
        "runs", "runs", "does not fit", "does not fit"]
    # two slots (1200 s each side by side): the third fills one slot's tail, the fourth still ends on the other
    planned = plan(configs, 1500, 2, 2, False, cost, fill=True)
    assert [c.state for c in planned] == ["runs", "runs", "runs part", "runs"]
    assert [c.slot for c in planned] == [0, 1, 0, 1] and planned[3].end == 1320
    planned = plan(configs, 1499, 2, 2, False, cost, fill=True)  # 299 s left: the plan stops as without fill
    assert [c.state for c in planned] == ["runs", "runs", "does not fit", "does not fit"]
    # the guard agrees: admitted with the deadline while five minutes are left, then refused for good
    now = [0.0]
    guard = BudgetGuard(1500, cost, 1, False, clock=lambda: now[0], fill=True)
    assert guard.admits(configs[0]) and guard.stop_at(configs[0]) is None
    now[0] = 1200
    assert guard.admits(configs[2]) and guard.stop_at(configs[2]) == 1500
    now[0] = 1500 - MIN_PART_S + 1
    assert not guard.admits(configs[1]) and not guard.admits(configs[3])
    now[0] = 0.0
    unfilled = BudgetGuard(1500, cost, 1, False, clock=lambda: now[0])
    assert unfilled.admits(configs[0])
    now[0] = 1200
    assert not unfilled.admits(configs[2])  # 1200 + 400 > 1500, no fill


def test_an_unfinished_cell_costs_what_it_has_left(tmp_path):
    import json

    import torch

    write_benchmarks(tmp_path / "bench")
    config = copy_config(also_select=["id"])
    model = CostModel("NVIDIA H200", benchmarks=tmp_path / "bench", results=tmp_path / "store")
    whole = model.cost(config)
    assert whole.train > 0 and whole.scoring > 0 and not cell_progress(tmp_path / "store", config).trained
    folder = tmp_path / "store" / "checkpoints"
    # half the steps behind the training checkpoint: half the training and validations left, all the scoring
    (folder / config.run_id).mkdir(parents=True)
    torch.save({"state": {"step": config.train_steps // 2}}, folder / config.run_id / "train.pt")
    half = model.cost(config)
    assert half.train == pytest.approx(whole.train / 2) and half.validation == pytest.approx(whole.validation / 2)
    assert half.scoring == pytest.approx(whole.scoring) and "50.0% of the steps done" in half.sources[-1]
    # trained, the 1x and 2x of its own selection scored: no training, the other lengths and selection left
    (folder / config.run_id / "model.pt").write_bytes(b"")
    (folder / config.run_id / "eval_rows.json").write_text(json.dumps([{"multiplier": 1}, {"multiplier": 2}]))
    once = whole.scoring / 2  # each selection scores the same lengths
    per_length = {m: 1000 * 64.0 / 1000 / 65536 * 64 * m + 1.0 for m in (1, 2, 4)}  # write_benchmarks' rate
    assert once == pytest.approx(sum(per_length.values()))
    left = model.cost(config)
    assert left.train == 0 and left.validation == 0 and left.sources[-1] == "resumed: trained"
    assert left.scoring == pytest.approx(per_length[4] + once)
    # the other selection in the store: only the first's 4x is left
    write_run(tmp_path / "store", config.selected_runs()[0].run_id, fake_rows(config.selected_runs()[0]))
    assert model.cost(config).scoring == pytest.approx(per_length[4])
    # an unreadable training checkpoint counts as nothing done
    other = copy_config(seed=1)
    (folder / other.run_id).mkdir()
    (folder / other.run_id / "train.pt").write_bytes(b"not a checkpoint")
    assert model.cost(other).train == pytest.approx(whole.train)


def fake_rows(config):
    row = dict.fromkeys(CONTRACT_COLUMNS)
    row.update(run_id=config.run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed,
               multiplier=1, metric="exact_match", score=1.0, config_json=config.to_json())
    return [row]


def test_a_sweep_with_a_budget_stops_cleanly_and_resumes(tmp_path, monkeypatch):
    import lengthbench.runner

    ran = []

    def fake_run_cell(config, results, **kwargs):
        ran.append(config.seed)
        write_run(results, config.run_id, fake_rows(config))
        return pd.DataFrame(fake_rows(config))

    monkeypatch.setattr(lengthbench.runner, "run_cell", fake_run_cell)
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2, 3])
    admitted = iter([True, True, False])
    outcomes = run_sweep(configs, tmp_path, device="cpu", admit=lambda config: next(admitted))
    assert [o.status for o in outcomes] == ["done", "done", "left", "left"] and ran == [0, 1]
    assert "budget" in outcomes[2].error
    # the next window runs what is left; finished cells are not asked about
    asked = []
    outcomes = run_sweep(configs, tmp_path, device="cpu", admit=lambda config: asked.append(config.seed) or True)
    assert [o.status for o in outcomes] == ["skipped", "skipped", "done", "done"] and asked == [2, 3]


WORKER = """
import json, sys
from lengthbench.store import CONTRACT_COLUMNS, write_run
config = json.loads(sys.argv[2])
write_run(sys.argv[1], sys.argv[3], [dict(dict.fromkeys(CONTRACT_COLUMNS), run_id=sys.argv[3], task=config["task"],
          attn=config["attn"], pe=config["pe"], seed=config["seed"], multiplier=1, metric="exact_match", score=1.0)])
"""


def test_a_cell_longer_than_the_budget_is_stopped_at_its_deadline_and_resumes(tmp_path, monkeypatch):
    import lengthbench.runner
    from lengthbench.sweep import STOPPED

    calls = []

    def slow_run_cell(config, results, **kwargs):  # an hour of training, unless interrupted
        calls.append((config.seed, kwargs.get("resume")))
        if len(calls) > 1:
            write_run(results, config.run_id, fake_rows(config))
            return pd.DataFrame(fake_rows(config))
        for _ in range(36000):
            time.sleep(0.1)
        raise AssertionError("not stopped")

    monkeypatch.setattr(lengthbench.runner, "run_cell", slow_run_cell)
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1])
    started = time.monotonic()
    outcomes = run_sweep(configs, tmp_path, device="cpu", admit=lambda config: True,
                         stop_at=lambda config: started + 0.5 if config.seed == 0 else None)
    assert time.monotonic() - started < 10
    assert [o.status for o in outcomes] == ["left", "left"] and outcomes[0].error == STOPPED
    # the next window resumes it (the runner's resume) and goes on
    outcomes = run_sweep(configs, tmp_path, device="cpu", admit=lambda config: True, stop_at=lambda config: None)
    assert [o.status for o in outcomes] == ["done", "done"] and calls[1] == (0, True)


SLOW_WORKER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as the sweep's worker does
try:
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_a_worker_longer_than_the_budget_gets_sigint_at_its_deadline(tmp_path):
    from lengthbench.sweep import STOPPED

    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2])
    started = time.monotonic()
    outcomes = run_sweep(configs, tmp_path, slots=["0", "0.1"], admit=lambda config: config.seed == 0,
                         stop_at=lambda config: started + 1.0 if config.seed == 0 else None,
                         worker_command=lambda config, results: [sys.executable, "-c", SLOW_WORKER])
    assert time.monotonic() - started < 30
    assert [o.status for o in outcomes] == ["left", "left", "left"] and outcomes[0].error == STOPPED
    assert "interrupted" in (tmp_path / "logs" / f"{configs[0].run_id}.log").read_text()


def test_cells_side_by_side_stop_cleanly_too(tmp_path):
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1, 2, 3, 4])
    admitted = iter([True, True, True, False])
    outcomes = run_sweep(configs, tmp_path, slots=["0", "0.1"], admit=lambda config: next(admitted),
                         worker_command=lambda config, results: [sys.executable, "-c", WORKER, str(results),
                                                                 config.to_json(), config.run_id])
    assert [o.status for o in outcomes] == ["done", "done", "done", "left", "left"]


SWEEP = """
cells = ["copy:softmax:rope", "copy:softmax:nape"]
seeds = [0, 1]
preset = "smoke"
per_gpu = 1
budget = "{budget}"
[overrides]
train_samples = 64
batch_size = 32
eval_samples = 4
val_samples = 4
max_multiplier = 2
d_model = 16
n_heads = 2
ffn = 32
n_layers = 1
diagnostics = false
"""


def test_cli_prints_the_plan_and_a_dry_run_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(budget="25m"))
    store = tmp_path / "store"
    assert cli(monkeypatch, "sweep", "--config", path, "--results", store, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "plan: 25.0 min on 1 x NVIDIA H100 80GB HBM3" in out and out.count(" runs ") == 4
    assert "4 cells fit" in out and "0 do not" in out and not store.exists()
    assert cli(monkeypatch, "sweep", "--config", path, "--results", store, "--dry-run", "--budget", "1s",
               "--plan-gpu", "NVIDIA H200") == 0
    out = capsys.readouterr().out
    assert "plan: 0.0 min on 1 x NVIDIA H200" in out and out.count("does not fit") == 4
    assert "0 cells fit" in out and "next after this budget: copy / softmax + rope / s0" in out


def test_cli_fill_plans_a_part_in_the_tail_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(budget="25m"))
    from lengthbench.cli import sweep

    monkeypatch.setattr(sweep, "_cost_model", lambda results, gpu: FixedCost({0: 600, 1: 6000}))
    args = ["sweep", "--config", path, "--results", tmp_path / "store", "--dry-run", "--budget", "28m"]
    assert cli(monkeypatch, *args) == 0
    out = capsys.readouterr().out
    assert "1 cell fits (10.0 min of 28.0 min), 3 do not" in out and "runs part" not in out
    assert cli(monkeypatch, *args, "--fill") == 0
    # seed 1 (100 min) is longer than the whole budget, and fills its tail
    out = " ".join(capsys.readouterr().out.split())
    assert "1 cell fits (28.0 min of 28.0 min), 2 do not" in out and out.count("runs part") == 1
    assert ("copy / softmax + rope / s1 (100.0 min left) fills the budget's last 18.0 min (--fill): it runs to "
            "the budget's end") in out
    monkeypatch.setattr(sweep, "_cost_model", lambda results, gpu: FixedCost({0: 6000, 1: 600}))
    assert cli(monkeypatch, *args) == 0  # a first cell longer than the whole budget, with or without --fill
    assert "copy / softmax + rope / s0 (100.0 min left) is longer than the budget" in " ".join(
        capsys.readouterr().out.split())
    monkeypatch.setattr(sweep, "_cost_model", lambda results, gpu: FixedCost({0: 600, 1: 6000}))
    path.write_text("fill = true\n" + SWEEP.format(budget="28m"))  # the config's key, no --fill
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path / "store", "--dry-run") == 0
    assert capsys.readouterr().out.count("runs part") == 1


def test_cli_fill_without_a_budget_is_one_line(tmp_path, monkeypatch, capsys):
    assert cli(monkeypatch, "sweep", "--tasks", "copy", "--attns", "softmax", "--pes", "rope", "--results",
               tmp_path / "s", "--fill", "--dry-run") == 2
    err = capsys.readouterr().err.strip()
    assert "--fill fills a budget's tail: give --budget too" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--budget", "soon"], "budget must be a duration"),
    (["--per-gpu", "many"], "--per-gpu must be a whole number or auto"),
    (["--mps", "maybe"], "unknown --mps 'maybe'"),
])
def test_cli_refuses_bad_budget_options_in_one_line(args, message, tmp_path, monkeypatch, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(budget="25m"))
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path / "s", "--dry-run", *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("key, value, message", [("budget", '"later"', "budget must be a duration"),
                                                  ("budget_fraction", "1.5", "budget_fraction"),
                                                  ("mps", '"always"', "mps must be"),
                                                  ("per_gpu", '"most"', "per_gpu must be"),
                                                  ("fill", '"yes"', "fill must be true or false")])
def test_a_sweep_files_bad_budget_keys_are_one_line(key, value, message, tmp_path, monkeypatch, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text(f'tasks = ["copy"]\nattns = ["softmax"]\npes = ["rope"]\n{key} = {value}\n')
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path / "s", "--dry-run") == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_real_sweep_whose_budget_fits_nothing_exits_0_and_says_what_is_next(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(budget="1s"))
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path / "store", "--device", "cpu") == 0
    out = capsys.readouterr().out
    assert "0 cells done, 4 left, next: copy / softmax + rope / s0" in out
    assert not list((tmp_path / "store" / "runs").glob("*.parquet")) if (tmp_path / "store" / "runs").exists() else True


def test_a_real_budgeted_sweep_runs_what_fits(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(budget="2h"))
    assert cli(monkeypatch, "sweep", "--config", path, "--results", tmp_path / "store", "--device", "cpu") == 0
    out = capsys.readouterr().out
    assert "4 cells: 4 ran" in out and len(list((tmp_path / "store" / "runs").glob("*.parquet"))) == 4


def test_sweep_status_says_cells_runs_hours_and_what_is_left(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(budget="2h").replace("diagnostics = false", "diagnostics = false\n"
                                                      "also_select = [\"2x\"]"))
    store = tmp_path / "store"
    assert cli(monkeypatch, "sweep", "--config", path, "--results", store, "--device", "cpu",
               "--cells", "copy:softmax:rope", "--seeds", "0") == 0
    capsys.readouterr()
    assert cli(monkeypatch, "sweep", "--config", path, "--results", store, "--status") == 0
    out = capsys.readouterr().out
    assert "1 of 4 cells done; 2 of 8 runs stored (a run per selection)" in out
    assert "GPU-hours spent" in out and "to finish: about" in out


def test_sweep_status_says_what_a_stopped_cell_resumes_from(tmp_path, monkeypatch, capsys):
    import re

    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(budget="2h"))
    store = tmp_path / "store"
    assert cli(monkeypatch, "sweep", "--config", path, "--results", store, "--status", "--cells",
               "copy:softmax:rope", "--seeds", "0") == 0
    run_id = re.search(r"copy-softmax-rope-smoke-s0-\w+", capsys.readouterr().out).group(0)
    (store / "checkpoints" / run_id).mkdir(parents=True)
    (store / "checkpoints" / run_id / "train.pt").write_bytes(b"")
    assert cli(monkeypatch, "sweep", "--config", path, "--results", store, "--status") == 0
    out = capsys.readouterr().out
    assert "to resume from its training checkpoint" in out and out.count("to resume") == 1


def test_auto_per_gpu_by_model_and_memory(tmp_path, monkeypatch):
    import lengthbench.budget

    monkeypatch.setattr(lengthbench.budget, "BENCHMARKS", tmp_path)
    small, wide = copy_config(), build_config("mqmtar", "softmax", "rope", "paper")
    assert auto_per_gpu([small], "NVIDIA H100", memory_gib=80) == 3
    assert auto_per_gpu([small, wide], "NVIDIA H100", memory_gib=80) == 2
    assert auto_per_gpu([small], "NVIDIA H100", memory_gib=30) == 1  # one cell's memory allowance
    # measured: the count with the most samples/s where one more gains 5% or more
    pd.DataFrame([dict(d_model=256, cells=2, mps=True, slowdown=1.2), dict(d_model=256, cells=3, mps=True,
                                                                          slowdown=2.9),
                  dict(d_model=512, cells=2, mps=True, slowdown=1.96)]).to_parquet(tmp_path / "side_by_side.parquet")
    assert auto_per_gpu([small], "NVIDIA H100", memory_gib=80) == 2  # 3 / 2.9 gains nothing over 2 / 1.2
    assert auto_per_gpu([wide], "NVIDIA H100", memory_gib=80) == 1  # 2 / 1.96 gains 2%


# -- MPS, with a stand-in for nvidia-cuda-mps-control ------------------------------------------------------------

# Like the real one: `-d` leaves a daemon process running (`... nvidia-cuda-mps-control -d`, here through Python),
# `quit` returns at once and the daemon goes a moment later, leaving its control pipe behind.
STAND_IN = """#!{python}
import os, subprocess, sys, time
from pathlib import Path
pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
log = Path(os.environ["MPS_STAND_IN_LOG"])
if sys.argv[1:] == ["-d"]:
    pipe.mkdir(parents=True, exist_ok=True)
    (pipe / "control").write_text("")
    (pipe / "quit").unlink(missing_ok=True)
    subprocess.Popen([sys.executable, __file__, "-d", "serve"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log.open("a").write("start\\n")
elif sys.argv[1:] == ["-d", "serve"]:
    while not (pipe / "quit").exists():
        time.sleep(0.05)
    time.sleep(0.3)
else:
    command = sys.stdin.read().split()
    clients = (pipe / "clients").read_text().split() if (pipe / "clients").exists() else []
    if command == ["quit"]:
        if os.environ.get("MPS_STAND_IN_HANG"):  # a daemon that does not answer
            time.sleep(60)
        (pipe / "quit").write_text("")
        log.open("a").write("quit\\n")
    elif command == ["get_server_list"] and clients:
        print(4242)
    elif command == ["get_client_list", "4242"]:
        print("\\n".join(clients))
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    binary = bin_dir / "nvidia-cuda-mps-control"
    binary.write_text(textwrap.dedent(STAND_IN.format(python=sys.executable)))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    monkeypatch.setenv("MPS_STAND_IN_LOG", str(tmp_path / "log"))
    yield tmp_path / "log"
    if (tmp_path / "pipe").is_dir():
        (tmp_path / "pipe" / "quit").write_text("")  # no stand-in daemon outlives its test
    deadline = time.monotonic() + 10
    while daemon_running() and time.monotonic() < deadline:
        time.sleep(0.05)


def calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_mps_starts_for_cells_side_by_side_and_stops_after(stand_in):
    lines = []
    with mps_for_sweep("auto", True, say=lines.append) as on:
        assert on and daemon_running() and calls(stand_in) == ["start"]
    assert calls(stand_in) == ["start", "quit"] and not daemon_running()
    assert "started" in lines[0] and "stopped" in lines[1]


def test_mps_stops_after_an_interrupt_too(stand_in):
    with pytest.raises(KeyboardInterrupt), mps_for_sweep("on", True, say=lambda line: None):
        raise KeyboardInterrupt
    assert calls(stand_in) == ["start", "quit"]


def test_mps_never_touches_a_daemon_it_did_not_start(stand_in, tmp_path):
    subprocess.run([str(tmp_path / "bin" / "nvidia-cuda-mps-control"), "-d"], check=True)
    lines = []
    with mps_for_sweep("auto", True, say=lines.append) as on:
        assert on
    assert calls(stand_in) == ["start"] and daemon_running() and "left running" in lines[0]


def test_mps_leaves_its_daemon_running_while_other_processes_use_it(stand_in, tmp_path):
    """A second sweep started on the same GPU meanwhile: quit would wait for its cells and turn away its next ones."""
    lines = []
    with mps_for_sweep("auto", True, say=lines.append, stop_seconds=0.5):
        (tmp_path / "pipe" / "clients").write_text("1\n")  # not this process's child
    assert calls(stand_in) == ["start"] and daemon_running()
    assert "still serves 1 process (pid 1), so it is left running" in lines[-1]


def test_mps_waits_for_its_own_workers_to_leave_the_daemon_then_stops_it(stand_in, tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lines = []
        with mps_for_sweep("auto", True, say=lines.append, stop_seconds=20):
            (tmp_path / "pipe" / "clients").write_text(f"{worker.pid}\n")
            threading.Timer(0.5, lambda: (tmp_path / "pipe" / "clients").write_text("")).start()
            started = time.monotonic()
        assert calls(stand_in) == ["start", "quit"] and not daemon_running()
        assert time.monotonic() - started < 10 and "stopped" in lines[-1]
    finally:
        worker.kill()
        worker.wait()


def test_a_daemon_that_does_not_answer_quit_is_reported_not_raised(stand_in, monkeypatch):
    monkeypatch.setenv("MPS_STAND_IN_HANG", "1")
    monkeypatch.setattr("lengthbench.mps.QUIT_TIMEOUT_S", 0.5)
    lines = []
    with mps_for_sweep("auto", True, say=lines.append, stop_seconds=0.5):
        pass
    assert "did not answer and the daemon still runs; stop it by hand" in lines[-1]


def test_a_control_pipe_left_behind_is_no_daemon(stand_in, tmp_path):
    """A daemon that quit leaves its control pipe: the next block starts a daemon of its own and stops it."""
    with mps_for_sweep("auto", True, say=lambda line: None):
        pass
    assert (tmp_path / "pipe" / "control").exists() and not daemon_running()
    lines = []
    with mps_for_sweep("auto", True, say=lines.append) as on:
        assert on and daemon_running()
    assert calls(stand_in) == ["start", "quit", "start", "quit"] and not daemon_running()
    assert "started" in lines[0] and "stopped" in lines[1]


@pytest.mark.parametrize("mode, side_by_side", [("off", True), ("auto", False), ("on", False)])
def test_mps_is_not_started_where_not_asked_or_not_needed(stand_in, mode, side_by_side):
    with mps_for_sweep(mode, side_by_side, say=lambda line: None) as on:
        assert not on
    assert calls(stand_in) == []


def test_mps_on_without_the_binary_is_an_error_and_auto_goes_without(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    with pytest.raises(UsageError, match="--mps on: nvidia-cuda-mps-control is not on the PATH"):
        with mps_for_sweep("on", True, say=lambda line: None):
            pass
    with mps_for_sweep("auto", True, say=lambda line: None) as on:
        assert not on


def test_auto_per_gpu_under_a_budget_takes_fewer_where_the_first_cell_fits_no_other_way(tmp_path, monkeypatch):
    from lengthbench.cli import sweep

    monkeypatch.setattr(sweep, "_cost_model", lambda results, gpu: FixedCost({0: 600, 1: 6000}))
    monkeypatch.setattr("lengthbench.budget.BENCHMARKS", tmp_path)
    pd.DataFrame([dict(d_model=256, cells=3, mps=True, slowdown=2.0)]).to_parquet(tmp_path / "side_by_side.parquet")
    import lengthbench.budget

    monkeypatch.setattr(lengthbench.budget.side_by_side_factor, "__defaults__", (tmp_path,))
    configs = plan_sweep(["copy"], ["softmax"], ["rope"], [0, 1])
    # 3 side by side: 600 s x 2.0; 2 (not measured): x 2; 1: 600 s
    assert sweep._fitting_per_gpu(configs, str(tmp_path), 1300, "NVIDIA H100", 3, True) == 3
    assert sweep._fitting_per_gpu(configs, str(tmp_path), 1000, "NVIDIA H100", 3, True) == 1
    assert sweep._fitting_per_gpu(configs, str(tmp_path), 100, "NVIDIA H100", 3, True) == 1  # none fits: alone
