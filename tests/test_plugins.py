"""Plugins by module name, file, package folder or module@folder; installed packages through the
``lengthbench.plugins`` entry points; what a stored run records of them."""

from __future__ import annotations

import sys

import pytest
from cli_helpers import cli

from lengthbench import plugins
from lengthbench.config import RunConfig
from lengthbench.errors import UsageError
from lengthbench.models.attention import ATTENTION
from lengthbench.models.attention.registry import MECHANISMS

PROBE = '''
import torch

from lengthbench.models.attention import AttentionLayer, causal_mask, register_attention


@register_attention("{name}")
class Probe(AttentionLayer):
    """A probe: uniform weights over the visible keys."""

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1]).to(scores.dtype)
        return (mask / mask.sum(-1, keepdim=True)).expand_as(scores)
'''


@pytest.fixture
def isolated(monkeypatch):
    """Registrations, sys.path, the plugins' folders and their modules are undone after the test."""
    monkeypatch.setattr(MECHANISMS, "_entries", dict(MECHANISMS._entries))
    monkeypatch.setattr(MECHANISMS, "_aliases", dict(MECHANISMS._aliases))
    monkeypatch.setattr(plugins, "_FOLDERS", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("lbp_"):
            del sys.modules[name]


def probe(folder, module: str, name: str):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(PROBE.format(name=name))
    return path


def test_a_plugin_by_file_folder_module_at_folder_path_or_the_current_folder(tmp_path, isolated, monkeypatch):
    file = probe(tmp_path / "a", "lbp_file", "lbp-file")
    probe(tmp_path / "b", "lbp_at", "lbp-at")
    package = tmp_path / "c" / "lbp_pkg"
    probe(package, "__init__", "lbp-pkg")
    probe(tmp_path / "d", "lbp_path", "lbp-path")
    probe(tmp_path / "e", "lbp_here", "lbp-here")
    monkeypatch.syspath_prepend(str(tmp_path / "d"))
    monkeypatch.chdir(tmp_path / "e")
    for spec, module, name, recorded in (
            (str(file), "lbp_file", "lbp-file", f"lbp_file@{tmp_path / 'a'}"),
            (f"lbp_at@{tmp_path / 'b'}", "lbp_at", "lbp-at", f"lbp_at@{tmp_path / 'b'}"),
            (str(package), "lbp_pkg", "lbp-pkg", f"lbp_pkg@{tmp_path / 'c'}"),
            ("lbp_path", "lbp_path", "lbp-path", f"lbp_path@{tmp_path / 'd'}"),
            ("lbp_here", "lbp_here", "lbp-here", f"lbp_here@{tmp_path / 'e'}")):  # not on the path: from here
        assert name not in ATTENTION
        assert plugins.load_plugin(spec) == module
        assert name in ATTENTION
        # what a run of it records, and what loads it again
        assert plugins.plugins_of(RunConfig("copy", name, "rope")) == [recorded]
        assert plugins.load_plugin(recorded) == module
    assert plugins.plugins_of(RunConfig("copy", "softmax", "rope")) == []  # built-in names: none
    assert {f"lbp_file@{tmp_path / 'a'}", f"lbp_at@{tmp_path / 'b'}"} <= set(plugins.loaded_plugins())


def test_a_module_of_one_name_from_two_folders_is_refused(tmp_path, isolated):
    first, second = probe(tmp_path / "one", "lbp_twice", "lbp-one"), probe(tmp_path / "two", "lbp_twice", "lbp-two")
    plugins.load_plugin(str(first))
    plugins.load_plugin(str(first))  # the same file again: nothing happens
    with pytest.raises(UsageError, match=f"a module named 'lbp_twice' is loaded already, from {tmp_path / 'one'}"):
        plugins.load_plugin(str(second))


def test_a_run_names_its_plugin_and_inspect_says_which_to_load(tmp_path, isolated, monkeypatch, capsys):
    # run with the plugin's file; the rows and model.pt record it; without it inspect and rescore say which to load
    file = probe(tmp_path / "mine", "lbp_recorded", "lbp-recorded")
    store = tmp_path / "store"
    assert cli(monkeypatch, "run", "--task", "copy", "--attn", "lbp-recorded", "--pe", "none", "--train-samples",
               "32", "--eval-samples", "2", "--max-multiplier", "2", "--no-diagnostics", "--quiet", "--results",
               store, "--plugin", file) == 0
    import pandas as pd

    (path,) = (store / "runs").glob("*.parquet")
    rows = pd.read_parquet(path)
    assert set(rows["plugins"]) == {f"lbp_recorded@{tmp_path / 'mine'}"}
    run_id = rows["run_id"].iloc[0]
    capsys.readouterr()
    del MECHANISMS._entries["lbp-recorded"]  # a later session that did not load it
    assert cli(monkeypatch, "inspect", "maps", "--run", run_id, "--length", "16", "--results", store, "--out",
               tmp_path / "maps") == 2
    err = capsys.readouterr().err
    assert f"uses the mechanism 'lbp-recorded', which no loaded module registers; load its plugin: --plugin {file}" \
        in err and len(err.strip().splitlines()) == 1
    del sys.modules["lbp_recorded"]  # the same command with the plugin named as it says
    assert cli(monkeypatch, "inspect", "maps", "--run", run_id, "--length", "16", "--results", store, "--out",
               tmp_path / "maps", "--plugin", file) == 0
    assert list((tmp_path / "maps").glob("*.png"))


ENTRY_POINT = """Metadata-Version: 2.1
Name: lbp-installed
Version: 0.1
"""


def installed(folder, module: str, source: str) -> None:
    """A package as ``pip install`` leaves it: its module and its dist-info with a ``lengthbench.plugins`` entry
    point."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(source)
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(ENTRY_POINT.replace("lbp-installed", module.replace("_", "-")))
    (info / "entry_points.txt").write_text(f"[lengthbench.plugins]\n{module} = {module}\n")


def test_an_installed_package_is_found_through_its_entry_point(tmp_path, isolated, monkeypatch, capsys):
    installed(tmp_path / "site", "lbp_installed", PROBE.format(name="lbp-installed"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert cli(monkeypatch, "attn", "list") == 0  # no --plugin: installing is enough
    assert "lbp-installed" in capsys.readouterr().out and "lbp-installed" in ATTENTION
    assert plugins.plugins_of(RunConfig("copy", "lbp-installed", "rope")) == ["lbp_installed@" + str(tmp_path /
                                                                                                      "site")]


def test_an_entry_point_that_fails_is_one_line_naming_it(tmp_path, isolated, monkeypatch, capsys):
    installed(tmp_path / "site", "lbp_broken", 'raise ImportError("needs a library this machine lacks")\n')
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert cli(monkeypatch, "tasks", "list") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("cannot load plugin 'lbp_broken' (entry point lbp_broken of the package lbp-broken): ImportError: "
            "needs a library this machine lacks") in err


def test_every_command_takes_plugin():
    from typer.main import get_command

    from lengthbench.cli import app

    def commands(group, path=()):
        for name, command in getattr(group, "commands", {}).items():
            yield from commands(command, (*path, name)) if hasattr(command, "commands") else [((*path, name),
                                                                                              command)]

    found = dict(commands(get_command(app)))
    assert len(found) >= 17
    for path, command in found.items():
        assert "--plugin" in {opt for param in command.params for opt in param.opts}, path
