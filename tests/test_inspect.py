"""``lengthbench inspect``: attention-map PNGs of a tiny saved run, diagnostics plots from a fake store."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from lengthbench.attention_figures import attention_maps
from lengthbench.cli import main
from lengthbench.models.decoder import Decoder, ModelConfig
from lengthbench.store import CONTRACT_COLUMNS, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["lengthbench", *args])
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def saved_run(tmp_path):
    """A tiny untrained copy model saved where ``lengthbench.runner.load_model`` finds a trained one."""
    from lengthbench.config import build_config
    from lengthbench.runner import atomic_torch_save, build_model, checkpoint_dir
    from lengthbench.tasks import get_task

    config = build_config("copy", "softmax", "nape", preset="smoke", d_model=16, n_heads=2, ffn=32, n_layers=2)
    torch.manual_seed(0)
    model = build_model(config, get_task("copy"))
    folder = checkpoint_dir(tmp_path, config.run_id)
    folder.mkdir(parents=True)
    atomic_torch_save({"config": config.identity(), "model": model.state_dict()}, folder / "model.pt")
    return tmp_path, config.run_id


def test_inspect_maps_writes_a_png_per_layer(saved_run, tmp_path, monkeypatch, capsys):
    results, run_id = saved_run
    out = tmp_path / "maps"
    code, stdout, stderr = invoke(monkeypatch, capsys, "inspect", "maps", "--run", run_id, "--length", "8",
                                  "--results", str(results), "--out", str(out))
    assert code == 0, stderr
    files = sorted(out.glob("*.png"))
    assert [f.name for f in files] == [f"{run_id}-n8-s0-layer0.png", f"{run_id}-n8-s0-layer1.png"]
    assert all(f.read_bytes()[:8] == PNG_MAGIC for f in files)
    assert str(files[0]) in stdout.replace("\n", "")


def test_inspect_maps_of_a_long_sequence_bins_the_keys(saved_run, tmp_path, monkeypatch, capsys):
    results, run_id = saved_run
    code, _, stderr = invoke(monkeypatch, capsys, "inspect", "maps", "--run", run_id, "--length", "200",
                             "--max-tokens", "64", "--results", str(results), "--out", str(tmp_path / "long"))
    assert code == 0, stderr
    assert len(list((tmp_path / "long").glob("*.png"))) == 2


def test_binned_maps_keep_the_mass_of_each_row():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, ffn=16, pe="alibi"))
    ids = torch.randint(1, 8, (1, 300))
    maps, rows, edges = attention_maps(model, ids, max_tokens=50)
    assert maps[0].shape == (2, 50, 50) and rows[-1] == 299 and edges[-1] == 300
    np.testing.assert_allclose(np.nansum(maps[0], axis=-1), 1.0, atol=1e-4)  # softmax rows sum to 1
    full, _, _ = attention_maps(model, ids[:, :40], max_tokens=50)
    assert full[0].shape == (2, 40, 40) and np.isnan(full[0][:, 0, 1]).all()  # causal part only


@pytest.mark.parametrize("args,message", [
    (["maps", "--run", "nope", "--length", "8"], "no trained model for run 'nope'"),
    (["maps", "--run", "nope", "--length", "8", "--results", "/definitely/missing"], "does not exist"),
    (["diagnostics", "--results", "/definitely/missing"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, saved_run, monkeypatch, capsys):
    results, _ = saved_run
    if "--results" not in args:
        args = [*args, "--results", str(results)]
    code, _, stderr = invoke(monkeypatch, capsys, "inspect", *args)
    assert code == 2
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def fake_rows(run_id: str, attn: str, seed: int, diagnostics: bool = True) -> list[dict]:
    rows = []
    for i, multiplier in enumerate([1, 2, 4, 8, 16]):
        row = {c: None for c in CONTRACT_COLUMNS}
        row.update(run_id=run_id, task="copy", attn=attn, pe="nape", seed=seed, train_length=64,
                   eval_length=64 * multiplier, multiplier=multiplier, exact_match=1.0 / (i + 1),
                   sparsity=0.1 * i if diagnostics else np.nan, sink_rate=0.25 if diagnostics else np.nan,
                   entropy=0.5 + 0.1 * i if diagnostics else np.nan, support=10.0 * (i + 1))
        rows.append(row)
    return rows


def test_inspect_diagnostics_plots_the_stored_rows(tmp_path, monkeypatch, capsys):
    store = tmp_path / "store"
    write_run(store, "a0", fake_rows("a0", "softmax", 0))
    write_run(store, "a1", fake_rows("a1", "softmax", 1))
    write_run(store, "b0", fake_rows("b0", "entmax", 0))
    out = tmp_path / "plots"
    code, stdout, stderr = invoke(monkeypatch, capsys, "inspect", "diagnostics", "--results", str(store),
                                  "--task", "copy", "--out", str(out))
    assert code == 0, stderr
    assert (out / "diagnostics-copy.png").read_bytes()[:8] == PNG_MAGIC

    code, _, stderr = invoke(monkeypatch, capsys, "inspect", "diagnostics", "--results", str(store),
                             "--task", "sort")
    assert code == 2 and "no stored rows with task 'sort'; stored: copy" in stderr


def test_inspect_diagnostics_without_measured_diagnostics(tmp_path, monkeypatch, capsys):
    store = tmp_path / "store"
    rows = fake_rows("a0", "softmax", 0, diagnostics=False)
    for row in rows:
        row["support"] = np.nan
    write_run(store, "a0", rows)
    code, _, stderr = invoke(monkeypatch, capsys, "inspect", "diagnostics", "--results", str(store),
                             "--out", str(tmp_path / "plots"))
    assert code == 2 and "no attention diagnostics" in stderr
