"""The commit a row records says what code made it: ``-dirty`` for uncommitted changes to the package's sources,
``+changed`` for sources edited after the process imported them (``lengthbench/devices.py``)."""

import subprocess

import pytest

from lengthbench import devices


def test_the_digest_follows_every_source_byte(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("x = 1\n")
    second.write_text("y = 2\n")
    before = devices.source_digest([first, second])
    assert devices.source_digest([first, second]) == before
    second.write_text("y = 3\n")
    assert devices.source_digest([first, second]) != before
    second.unlink()
    assert devices.source_digest([first, second]) not in (before, devices.source_digest([first]))


def test_the_package_sources_are_the_installed_folders():
    files = devices.source_files()
    names = {path.name for path in files}
    assert {"devices.py", "short_rows.py", "decoder.py"} <= names  # lengthbench/, kernels/, models/
    assert any(path.parent.name == "attention" for path in files)  # the subpackages' files too
    assert devices.source_digest() == devices.SOURCE_AT_START  # nothing edited them while the tests ran


def test_a_row_made_after_the_sources_changed_says_so(monkeypatch):
    monkeypatch.setenv("LENGTHBENCH_GIT_SHA", "abc1234")
    assert devices.git_sha() == "abc1234"
    monkeypatch.setattr(devices, "SOURCE_AT_START", "000000000000")
    assert devices.git_sha() == "abc1234+changed"


def test_uncommitted_source_changes_make_the_checkout_dirty(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    try:
        git("init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("read me\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    sources = [tmp_path / "pkg"]
    assert not devices.dirty(tmp_path, sources)
    (tmp_path / "README.md").write_text("other\n")  # not a source
    (tmp_path / "pkg" / "new.py").write_text("y = 2\n")  # untracked
    assert not devices.dirty(tmp_path, sources)
    (tmp_path / "pkg" / "m.py").write_text("x = 2\n")
    assert devices.dirty(tmp_path, sources)
    assert not devices.dirty(tmp_path, [tmp_path.parent / "elsewhere"])
