"""The published leaderboard: a section per paper-table config holding exactly that config's runs, both
selections, cells done of total, and the CLI's default and --all."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
from cli_helpers import cli

from lengthbench.published import build_sections, read_section, sections_markdown
from lengthbench.store import CONTRACT_COLUMNS, load_results, write_run

CONFIG = """
# A Paper (Someone, 2025), Table 9, Copy:
# the protocol, stated.
cells = ["copy:softmax:rope", "copy:entmax:nape"]
seeds = [0, 1]
preset = "smoke"
budget_fraction = 0.5
[overrides]
train_samples = 64
max_multiplier = 4
selection = "2x"
also_select = ["id"]
"""


def rows_of(config, scores, run_id=None, selection=None):
    rows = []
    for multiplier, score in zip((1, 2, 4), scores, strict=True):
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=run_id or config.run_id, task=config.task, attn=config.attn, pe=config.pe,
                   seed=config.seed, preset=config.preset, train_length=64, eval_length=64 * multiplier,
                   multiplier=multiplier, metric="exact_match", score=score, exact_match=score, n_samples=10,
                   selection=selection or config.selection, config_json=config.to_json(),
                   created_at="2026-12-06T00:00:00+00:00")
        rows.append(row)
    return rows



def copy_config(tmp_path, header: str):
    """A one-cell Copy config (softmax + RoPE, seed 0, smoke, to 4x) under ``header``, as tmp_path/copy.toml."""
    path = tmp_path / "copy.toml"
    path.write_text(textwrap.dedent(header) + textwrap.dedent("""
        cells = ["copy:softmax:rope"]
        seeds = [0]
        preset = "smoke"
        [overrides]
        max_multiplier = 4
        """))
    return path

def test_a_section_holds_its_configs_runs_only(tmp_path):
    path = tmp_path / "a_paper_table9_copy.toml"
    path.write_text(textwrap.dedent(CONFIG))
    section = read_section(path)
    assert section.title == "A Paper (Someone, 2025), Table 9, Copy" and section.budget_fraction == 0.5
    assert len(section.cells) == 4 and len(section.expected()) == 8  # 2 cells x 2 seeds x 2 selections
    store = tmp_path / "store"
    softmax0, softmax1, entmax0, entmax1 = section.cells
    write_run(store, softmax0.run_id, rows_of(softmax0, [1.0, 0.5, 0.0]))
    write_run(store, softmax1.run_id, rows_of(softmax1, [1.0, 0.7, 0.1]))
    (kept,) = softmax0.selected_runs()
    write_run(store, kept.run_id, rows_of(kept, [1.0, 0.2, 0.0]))
    (kept1,) = softmax1.selected_runs()
    write_run(store, kept1.run_id, rows_of(kept1, [1.0, 0.4, 0.0]))
    write_run(store, entmax0.run_id, rows_of(entmax0, [0.9, 0.9, 0.9]))
    # a run of another protocol (another sample count) of the same cell: not in the section
    import dataclasses

    other = dataclasses.replace(softmax0, train_samples=128)
    write_run(store, other.run_id, rows_of(other, [1.0, 1.0, 1.0]))
    board = build_sections(load_results(store), [section])
    paper = board[board["selection_kind"] == "paper"].set_index("attn")
    assert paper.loc["softmax", "seeds"] == 2 and paper.loc["softmax", "2x"] == 70.0  # best of seeds: seed 1
    assert paper.loc["softmax", "2x_mean"] == 60.0 and paper.loc["entmax", "seeds"] == 1
    chosen = board[board["selection_kind"] == "id"].set_index("attn")
    assert chosen.loc["softmax", "2x"] == 40.0 and chosen.loc["entmax", "seeds"] == 0  # not run yet
    assert set(board["cells_done"]) == {1} and set(board["cells_total"]) == {2}
    text = sections_markdown(board, [section])
    assert "## A Paper (Someone, 2025), Table 9, Copy" in text
    assert "Cells done: 1 of 2; runs stored: 5 of 8." in text
    assert "budget fraction 0.5" in text and "checkpoint selection at 2x and in distribution" in text
    from lengthbench.leaderboard import wilson

    def shown(score):  # best of seeds with its 95% Wilson interval over the 10 samples scored
        low, high = wilson(score, 10)
        return f"{100 * score:.1f} ({100 * low:.1f}–{100 * high:.1f})"

    assert f"| softmax | rope | {shown(1.0)} | {shown(0.7)} | {shown(0.1)} |" in text
    assert "| entmax | nape | – | – | – | – | – | not run |" in text
    assert paper.loc["softmax", "2x_lo"] == pytest.approx(100 * wilson(0.7, 10)[0])
    assert "100.0" in text and "1.0 ±" not in text.split("Mean")[0]


def test_the_cli_publishes_sections_by_default_and_every_run_with_all(tmp_path, monkeypatch, capsys):
    path = tmp_path / "a_paper_table9_copy.toml"
    path.write_text(textwrap.dedent(CONFIG))
    section = read_section(path)
    store = tmp_path / "store"
    config = section.cells[0]
    write_run(store, config.run_id, rows_of(config, [1.0, 0.5, 0.0]))
    stray = dataclasses_replace(config, seed=9)
    write_run(store, stray.run_id, rows_of(stray, [0.3, 0.3, 0.3]))
    assert cli(monkeypatch, "leaderboard", "--results", store, "--config", path, "--publish", tmp_path / "pub") == 0
    text = (tmp_path / "pub" / "leaderboard.md").read_text()
    assert "## A Paper (Someone, 2025), Table 9, Copy" in text and "30.0" not in text  # the stray seed is not in it
    published = pd.read_parquet(tmp_path / "pub" / "leaderboard.parquet")
    assert set(published["section"]) == {"a_paper_table9_copy"}
    capsys.readouterr()
    assert cli(monkeypatch, "leaderboard", "--results", store, "--all") == 0
    assert "| 2 (best: 0) |" in capsys.readouterr().out  # --all: every run, the stray seed too
    assert cli(monkeypatch, "leaderboard", "--results", store, "--all", "--config", path) == 2
    assert cli(monkeypatch, "leaderboard", "--results", store, "--config", tmp_path / "none.toml") == 2


def dataclasses_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


def test_the_paper_beside_ours_and_the_verdict(tmp_path):
    from lengthbench.published import grade

    row = {"seeds": 3, "2x": 92.0, "2x_lo": 90.0, "2x_hi": 93.5, "4x": 50.0, "4x_lo": 43.0, "4x_hi": 57.0}
    assert grade(row, {2: 95.0, 4: 52.0})[0] == "agrees"  # 3 and 2 points off
    assert grade(row, {2: 99.0})[0] == "below"  # 7 points below and outside our interval
    assert grade(row, {4: 56.5})[0] == "agrees"  # 6.5 points off, inside our interval [43, 57]
    assert grade(row, {2: 80.0, 4: 60.0})[0] == "mixed"
    assert grade(row, {8: 10.0})[0] == "no common length"
    assert grade({"seeds": 0}, {2: 10.0})[0] == "not run"


def test_a_section_names_its_paper_table_and_explains_what_does_not_agree(tmp_path):
    path = tmp_path / "copy.toml"
    path.write_text(textwrap.dedent("""
        # Long-Context Generalization with Sparse Attention, Table 1, Copy:
        paper = "Long-Context Generalization with Sparse Attention"
        table = "Table 1"
        cells = ["copy:softmax:rope", "copy:entmax:nape"]
        seeds = [0]
        preset = "smoke"
        [overrides]
        max_multiplier = 4
        [explained]
        "softmax:rope" = "a reason, with its evidence"
        """))
    section = read_section(path)
    store = tmp_path / "store"
    write_run(store, section.cells[0].run_id, rows_of(section.cells[0], [1.0, 0.9, 0.9]))
    text = sections_markdown(build_sections(load_results(store), [section]), [section])
    from lengthbench.compare import load_paper_tables

    tables = load_paper_tables()
    printed = tables[(tables["paper"] == "Long-Context Generalization with Sparse Attention") & (tables["table"] == "Table 1") & (tables["task"] == "copy")
                     & (tables["attn"] == "softmax") & (tables["pe"] == "rope")].set_index("multiplier")["value"]
    assert f"| softmax | rope | 100.0 / {printed[1]:.1f} | 90.0 / {printed[2]:.1f} |" in text
    assert "| above | a reason, with its evidence |" in text  # softmax + RoPE is near 0 at 2x in the paper
    assert "| entmax | nape | – / " in text and "| not run |" in text


def test_several_stores_at_once_and_filters(tmp_path, monkeypatch, capsys):
    path = tmp_path / "a_paper_table9_copy.toml"
    path.write_text(textwrap.dedent(CONFIG))
    section = read_section(path)
    one, two = tmp_path / "one", tmp_path / "two"
    write_run(one, section.cells[0].run_id, rows_of(section.cells[0], [1.0, 0.5, 0.0]))
    write_run(two, section.cells[2].run_id, rows_of(section.cells[2], [0.9, 0.9, 0.9]))
    write_run(two, section.cells[0].run_id, rows_of(section.cells[0], [1.0, 0.5, 0.0]))  # the same run in both
    for results in (["--results", one, "--results", two], ["--results", f"{one},{two}"]):
        assert cli(monkeypatch, "leaderboard", *results, "--all", "--format", "csv") == 0
        board = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
        assert sorted(board["attn"]) == ["entmax", "softmax"] and set(board["seeds"]) == {1}
    assert cli(monkeypatch, "leaderboard", "--results", one, "--results", two, "--all", "--format", "csv",
               "--attn", "entmax") == 0
    assert list(pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))["attn"]) == ["entmax"]
    assert cli(monkeypatch, "leaderboard", "--results", one, "--all", "--pe", "alibi") == 2
    assert "--pe alibi: no runs of it" in capsys.readouterr().err
    assert cli(monkeypatch, "leaderboard", "--results", f"{one},", "--all") == 2


def test_compare_puts_your_runs_at_a_protocol_beside_its_published_rows(tmp_path, monkeypatch, capsys):
    import dataclasses

    from lengthbench.published import beside_published, build_sections

    path = copy_config(tmp_path, """
        # Long-Context Generalization with Sparse Attention, Table 1, Copy:
        paper = "Long-Context Generalization with Sparse Attention"
        table = "Table 1"
        """)
    section = read_section(path)
    published_store, mine = tmp_path / "published", tmp_path / "mine"
    write_run(published_store, section.cells[0].run_id, rows_of(section.cells[0], [1.0, 0.2, 0.0]))
    published = build_sections(load_results(published_store), [section])
    # your mechanism at the protocol (sparsemax stands in for a plugin's), and one at another protocol
    from lengthbench.sweep import configs_of_sweep

    (yours,) = configs_of_sweep(section.settings, cells="copy:sparsemax:rope")
    write_run(mine, yours.run_id, rows_of(yours, [1.0, 0.6, 0.3]))
    other = dataclasses.replace(yours, lr=0.5)
    write_run(mine, other.run_id, rows_of(other, [0.1, 0.1, 0.1]))
    text = beside_published(load_results(mine), section, published)
    assert "| softmax | rope | the paper |" in text and "| softmax | rope | published | 100.0 (" in text
    assert "| sparsemax | rope | yours | 100.0 (" in text and "60.0 (" in text and "10.0 (" not in text
    assert cli(monkeypatch, "compare", "--results", mine, "--config", path) == 0
    assert "| sparsemax | rope | yours |" in capsys.readouterr().out
    assert cli(monkeypatch, "compare", "--results", published_store, "--config", tmp_path / "none.toml") == 2


def test_compare_names_the_plugin_a_run_at_the_protocol_needs(tmp_path, monkeypatch, capsys):
    import dataclasses

    path = copy_config(tmp_path, """
        # A table, Copy:
        """)
    section = read_section(path)
    mine = tmp_path / "mine"
    stranger = dataclasses.replace(section.cells[0], attn="notloaded")
    rows = [dict(row, plugins="my_attention@/somewhere") for row in rows_of(stranger, [1.0, 0.5, 0.0])]
    write_run(mine, stranger.run_id, rows)
    assert cli(monkeypatch, "compare", "--results", mine, "--config", path) == 2
    err = capsys.readouterr().err.strip()
    assert "uses the mechanism 'notloaded'" in err and "--plugin my_attention@/somewhere" in err
    assert len(err.splitlines()) == 1


def test_the_protocol_line_states_a_non_default_init_and_the_task_parameters(tmp_path):
    from lengthbench.published import protocol_line

    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    assert "init" not in protocol_line(read_section(path)) and "; task " not in protocol_line(read_section(path))
    path.write_text(CONFIG.replace("[overrides]", '[overrides]\ninit = "torch"\ntask_params = {symbols = 8}'))
    line = protocol_line(read_section(path))
    assert ", init torch; task symbols=8; checkpoint selection" in line
