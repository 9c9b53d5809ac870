"""benchmarks/train_levers.py without a GPU: its levers, its commands and its comparison table (CPU, fast)."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import train_levers  # noqa: E402


def test_levers_parse_to_strings_and_reject_what_is_not_a_lever():
    levers = train_levers.parse_levers(
        '{"fwd64": {"LENGTHBENCH_CAPTURE_TUNING": {"stickbreaking": {"fwd": [64, 32, 4, 2]}}},'
        ' "mask": {"LENGTHBENCH_SDPA_ALIBI": "mask"}}')
    assert levers == {"fwd64": {"LENGTHBENCH_CAPTURE_TUNING": '{"stickbreaking": {"fwd": [64, 32, 4, 2]}}'},
                      "mask": {"LENGTHBENCH_SDPA_ALIBI": "mask"}}
    for text, said in (("{", "not JSON"), ("[]", "JSON object"), ("{}", "JSON object"), ('{"a": {}}', "JSON object"),
                       ('{"default": {"LENGTHBENCH_SDPA_ALIBI": "mask"}}', "not a lever name"),
                       ('{"a": {"PATH": "/"}}', "sets PATH")):
        with pytest.raises(ValueError, match=said):
            train_levers.parse_levers(text)


def test_bad_levers_exit_2_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_levers.py"), "--levers", "{",
                           "--attns", "entmax", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: --levers is not JSON")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_commands_run_the_default_first_with_each_levers_variables_only(monkeypatch, tmp_path):
    import argparse

    monkeypatch.setenv("LENGTHBENCH_SDPA_ALIBI", "mask")  # a variable of the caller's shell reaches no command
    args = argparse.Namespace(tasks="copy,mqrar", attns="entmax", pes="rope", preset="paper", batch_size=128,
                              steps=300, warmup=20, warm_jobs=6, out=str(tmp_path))
    runs = train_levers.commands(args, {"a": {"LENGTHBENCH_NARROW_TUNING": "{}"}})
    assert [(task, lever) for task, lever, _, _ in runs] == [("copy", "default"), ("copy", "a"),
                                                             ("mqrar", "default"), ("mqrar", "a")]
    assert "LENGTHBENCH_SDPA_ALIBI" not in runs[0][2] and runs[1][2]["LENGTHBENCH_NARROW_TUNING"] == "{}"
    command = runs[1][3]
    assert command[command.index("--attns") + 1] == "softmax,entmax"
    args.pes = "nape"
    assert "--pes rope,nape " in " ".join(train_levers.commands(args, {})[0][3]) + " "
    assert command[command.index("--out") + 1] == str(tmp_path / "copy" / "a")


def test_comparison_puts_each_lever_beside_the_default():
    def frame(entmax, closing=0.99):
        return pd.DataFrame(dict(attn=["softmax", "entmax", "softmax"], pe="rope", closing=[False, False, True],
                                 vs_softmax_rope=[1.0, entmax, closing]))

    table = train_levers.comparison({("copy", "default"): frame(0.68), ("copy", "tiles"): frame(0.75)})
    assert list(table.columns) == ["task", "attn", "pe", "default", "tiles"]
    row = table[table["attn"] == "entmax"].iloc[0]
    assert (row["default"], row["tiles"]) == (0.68, 0.75)
    assert json.loads(json.dumps(list(table["attn"]))) == ["softmax", "entmax"]
