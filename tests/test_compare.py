"""``lengthbench compare``: our leaderboard beside the papers' tables (lengthbench/compare.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from cli_helpers import cli
from test_leaderboard import digest, synthetic_run

from lengthbench.compare import (
    PAPER_TABLES,
    compare,
    load_paper_tables,
    paper_table_problems,
    stands_for,
    summary,
    to_markdown,
    verdict,
)
from lengthbench.leaderboard import load_store

SPARSE = "Long-Context Generalization with Sparse Attention"
PAPERS_CSV = f"""paper,table,task,attn,pe,multiplier,value
Sieve Attention,Table 1,copy,sieve,none,1,100.0
Sieve Attention,Table 1,copy,sieve,none,4,99.8
Sieve Attention,Table 1,copy,softmax,rope,1,100.0
Sieve Attention,Table 1,copy,softmax,rope,4,0.0
{SPARSE},Table 5,sort,"entmax (alpha=4)",none,1,90.0
{SPARSE},Table 5,sort,"entmax (alpha=4)",none,2,80.0
{SPARSE},Table 5,maxretrieval,softmax,none,1,98.6
{SPARSE},Table 1,reverse,entmax,nape,1,100.0
{SPARSE},Table 1,reverse,entmax,nape,1.5,99.0
"""


@pytest.fixture
def papers(tmp_path):
    path = tmp_path / "papers.csv"
    path.write_text(PAPERS_CSV)
    return path


@pytest.fixture
def store(tmp_path):
    results = tmp_path / "store"
    budget = {"train_samples": 2_000_000, "batch_size": 256, "lr": 1e-3}
    synthetic_run(results, "copy", "softmax", "rope", 0, {1: 1.0, 2: 0.1, 4: 0.02}, config=budget)
    synthetic_run(results, "copy", "softmax", "rope", 1, {1: 0.98, 2: 0.0, 4: 0.0}, config=budget)
    # Sieve (far below the paper) and the window of its Algorithm 1 (close to it): both stand for it
    synthetic_run(results, "copy", "sieve", "none", 0, {1: 0.5, 2: 0.0, 4: 0.0}, config=budget)
    synthetic_run(results, "copy", "sieve-window", "none", 0, {1: 1.0, 2: 0.99, 4: 0.97}, config=budget)
    # another alpha is another mechanism; another layout is another task; n 16 is a curriculum's stage
    synthetic_run(results, "copy", "sieve", "none", 1, {1: 1.0, 4: 0.998}, config={**budget, "attn_params": {"alpha": 1.25}})
    synthetic_run(results, "copy", "softmax", "rope", 2, {1: 1.0, 4: 0.0},
                  config={**budget, "task_params": {"layout": "other"}})
    synthetic_run(results, "sort", "entmax", "none", 0, {1: 0.99, 2: 0.95}, config=budget)
    synthetic_run(results, "sort", "entmax", "none", 0, {1: 0.92, 2: 0.70}, config={**budget, "attn_params": {"alpha": 4.0}})
    # Max Retrieval's training length is 16: a run at 64 is another protocol than the paper's
    synthetic_run(results, "maxretrieval", "softmax", "none", 0, {1: 0.99, 2: 0.95}, config=budget)
    return results


def test_stands_for_names_stand_ins_and_identity_parameters():
    assert stands_for("sieve", "sieve") and stands_for("sieve-window (eps=8)", "sieve")
    assert not stands_for("sieve (alpha=1.25)", "sieve") and stands_for("sieve (alpha=1.5)", "sieve")
    assert stands_for("entmax (alpha=4)", "entmax (alpha=4)") and not stands_for("entmax", "entmax (alpha=4)")
    assert not stands_for("entmax (alpha=16)", "entmax") and not stands_for("asentmax", "entmax")
    assert stands_for("ssmax (s_init=1, scaled_heads=nope)", "ssmax")  # ways to implement it: variants
    assert not stands_for("softmax", "softmax (theta=0.1)") and stands_for("softmax (theta=0.1)", "softmax (theta=0.1)")
    assert stands_for("entmax (alpha=4.0)", "entmax (alpha=4)") and stands_for("asentmax", "asentmax (gamma=1)")


@pytest.mark.parametrize("differences, expected", [
    ([0.0, -4.9, 5.0], "agrees"), ([0.0, 12.0], "above"), ([-6.0, 1.0], "below"), ([-6.0, 6.0], "mixed"),
    ([], "no common length")])
def test_verdicts(differences, expected):
    assert verdict(differences, 5.0) == expected


def test_every_paper_cell_gets_the_rows_that_stand_for_it_closest_first(store, papers):
    long = compare(load_store(store)[0], load_paper_tables(papers))
    sieve = long[(long["attn"] == "sieve") & (long["task"] == "copy")]
    assert list(sieve.drop_duplicates("rank")["our_attn"]) == ["sieve-window", "sieve"]  # alpha 1.25 is left out
    closest = sieve[sieve["rank"] == 0].set_index("multiplier")
    assert closest.loc[4, "our_value"] == pytest.approx(97.0) and closest.loc[4, "difference"] == pytest.approx(-2.8)
    assert set(closest["verdict"]) == {"agrees"}
    assert set(sieve[sieve["rank"] == 1]["verdict"]) == {"below"}
    softmax = long[(long["attn"] == "softmax") & (long["task"] == "copy")]
    # best of seeds by AUC (seed 0), and only the default layout's table
    assert set(softmax["our_value"]) == {100.0, 2.0} and softmax["seeds"].eq(2).all()
    assert long[(long["task"] == "sort")].drop_duplicates("rank")["our_attn"].tolist() == ["entmax (alpha=4)"]
    assert long[(long["task"] == "maxretrieval")]["verdict"].eq("no run").all()
    reverse = long[long["task"] == "reverse"]
    assert reverse["verdict"].eq("no run").all() and len(reverse) == 2


def test_a_store_of_no_paper_mechanism_gives_every_column_and_its_markdown(tmp_path, papers):
    # a store of one's own mechanism: every paper cell "no run", the long form's columns all there
    synthetic_run(tmp_path / "mine", "copy", "softmax", "rope", 0, {1: 1.0, 4: 0.5})
    frame = load_store(tmp_path / "mine")[0].assign(attn="lb-mine")
    long = compare(frame, load_paper_tables(papers))
    assert long["verdict"].eq("no run").all() and {"metric", "our_value", "difference"} <= set(long.columns)
    assert "| sieve + none | Sieve Attention | 100.0 | 99.8 |" in to_markdown(long)


def test_summary_and_markdown(store, papers):
    long = compare(load_store(store)[0], load_paper_tables(papers))
    table = summary(long).set_index(["paper", "table", "task"])
    assert table.loc[("Sieve Attention", "Table 1", "copy"), ["cells", "agrees"]].tolist() == [2, 2]
    # 92 / 70 against 90 / 80: 10 points below at 2x, but on 16 samples the paper's 80 lies inside our 95% Wilson
    # interval there ([45.6, 86.7]): it agrees
    assert table.loc[(SPARSE, "Table 5", "sort"), "agrees"] == 1
    assert table.loc[(SPARSE, "Table 1", "reverse"), "no run"] == 1
    text = to_markdown(long, rows_per_cell=1)
    assert "| Sparse Attention | Table 5 | sort | 1 | 1 | 0 | 0 |" in text  # the summary, its short title
    assert f"## {SPARSE}, Table 5: sort" in text
    assert "| sieve + none | Sieve Attention | 100.0 | 99.8 |" in text
    # ours, minus the paper's, our 95% Wilson interval (16 samples)
    assert "|  | ours: sieve-window + none | 100.0 (+0.0) [81–100] | 97.0 (-2.8) [76–100] | agrees |" in text
    assert "(1 more rows of ours)" in text
    assert "|  | ours | – | – | no run |  |" in text


def test_cli_writes_markdown_and_parquet_and_leaves_the_store_alone(store, papers, tmp_path, monkeypatch, capsys):
    before = digest(store)
    assert cli(monkeypatch, "compare", "--results", store, "--paper-tables", papers, "--task", "copy") == 0
    assert "## Sieve Attention, Table 1: copy" in capsys.readouterr().out
    out = tmp_path / "published"
    assert cli(monkeypatch, "compare", "--results", store, "--paper-tables", papers, "--publish", out) == 0
    frame = pd.read_parquet(out / "paper_comparison.parquet")
    assert {"paper", "attn", "our_attn", "multiplier", "paper_value", "our_value", "verdict"} <= set(frame.columns)
    assert set(frame["paper"]) == {"Sieve Attention", SPARSE}
    assert (out / "paper_comparison.md").read_text().startswith("# Our leaderboard beside the papers' tables")
    assert digest(store) == before


@pytest.mark.parametrize("args, message", [
    (["--tolerance", "-1"], "--tolerance"), (["--rows", "-2"], "--rows"), (["--task", "nosuch"], "no paper table has"),
    (["--results", "missing-folder"], "does not exist"), (["--paper-tables", "missing.csv"], "does not exist")])
def test_cli_bad_input_is_one_line_and_exit_2(args, message, store, papers, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    base = {"--results": str(store), "--paper-tables": str(papers)}
    for key, value in zip(args[::2], args[1::2], strict=True):
        base[key] = value
    assert cli(monkeypatch, "compare", *[x for pair in base.items() for x in pair]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_the_shipped_paper_tables_name_our_tasks_mechanisms_and_encodings_and_papers_by_title():
    import lengthbench.models.attention  # noqa: F401 - registers the mechanisms
    from lengthbench.models.attention.registry import ATTENTION
    from lengthbench.models.positional import POSITIONAL_ENCODINGS
    from lengthbench.tasks import task_names

    papers = load_paper_tables(PAPER_TABLES)
    assert not paper_table_problems(papers, tasks=task_names(), attns=ATTENTION.names(),
                                    pes=POSITIONAL_ENCODINGS.names())
    assert papers["value"].between(0, 100).all()
    # every paper by its title: the titles the paper-table configs name
    assert set(papers["paper"]) == {"Sieve Attention", SPARSE}
    # the headline rows of the priority tables (Sieve Attention Table 1, Sparse Attention Table 1) are there
    cells = set(zip(papers["paper"], papers["task"], papers["attn"], papers["pe"], strict=True))
    assert {("Sieve Attention", "mqrar", "sieve", "none"), ("Sieve Attention", "copy", "stickbreaking", "none"),
            (SPARSE, "mqmtar", "asentmax", "nape"), (SPARSE, "sort", "ssmax", "rope")} <= cells


def test_the_published_comparison_is_what_the_committed_store_and_paper_tables_give(tmp_path, monkeypatch):
    """results/paper_comparison.md is generated, not edited: regenerating it from results/ gives the same file."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the command line written into the file names the store relative to the checkout
    assert cli(monkeypatch, "compare", "--results", "results", "--out", tmp_path / "again.md") == 0
    published = (root / "results" / "paper_comparison.md").read_text()
    assert (tmp_path / "again.md").read_text() == published


def test_a_difference_beyond_the_tolerance_agrees_inside_our_interval():
    from lengthbench.compare import verdict

    assert verdict([-10.0], 5.0) == "below" and verdict([-10.0], 5.0, [True]) == "agrees"
    assert verdict([-10.0, 8.0], 5.0, [False, False]) == "mixed" and verdict([-10.0, 8.0], 5.0, [False, True]) == "below"
    assert verdict([], 5.0) == "no common length"

