"""Plugins: modules outside lengthbench that register tasks, mechanisms or encodings (docs/plugins.md).

A plugin is named in one of three ways, on every command's ``--plugin`` (repeatable) and in the
``LENGTHBENCH_PLUGINS`` variable (comma-separated):

- a module name, ``my_attention`` or ``my_package.attention``, imported from Python's path (or, failing
  that, from the current folder);
- a file or a package folder, ``examples/my_attention.py`` or ``src/my_package``, imported from the folder
  that holds it;
- ``module@folder``, the module imported from ``folder``.

An installed package needs none of these: its ``lengthbench.plugins`` entry points are loaded by every
command. A plugin that fails to import is one line naming it and the error (a :class:`UsageError`).

A stored run records the plugins that registered its task, mechanism and encoding (:func:`plugins_of`, as
``module`` or ``module@folder``), so that ``inspect`` and ``rescore`` can say which one to load
(:func:`check_loaded`) and a sweep's workers load the same ones (:func:`loaded_plugins`).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from lengthbench.errors import UsageError

ENTRY_POINT_GROUP = "lengthbench.plugins"
ENVIRONMENT = "LENGTHBENCH_PLUGINS"
HELP = "Your tasks, mechanisms or encodings: a module, its .py file or module@folder (repeatable)."

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# the folder each top-level module loaded from a file or module@folder came from
_FOLDERS: dict[str, Path] = {}


def load_plugins(specs: Iterable[str] = (), *, environment: bool = False, entry_points: bool = False) -> None:
    """Import each plugin of ``specs``; with ``environment`` those of ``LENGTHBENCH_PLUGINS`` too, with
    ``entry_points`` every installed ``lengthbench.plugins`` entry point."""
    specs = list(specs)
    if environment:
        specs += [spec for spec in os.environ.get(ENVIRONMENT, "").split(",") if spec.strip()]
    for spec in specs:
        load_plugin(spec)
    if entry_points:
        from importlib.metadata import entry_points as installed

        for entry in installed(group=ENTRY_POINT_GROUP):
            try:
                entry.load()
            except (Exception, SystemExit) as error:
                raise UsageError(f"cannot load plugin {entry.name!r} (entry point {entry.value} of "
                                 f"{_distribution(entry)}): {_error_line(error)}") from error


def load_plugin(spec: str) -> str:
    """Import the plugin ``spec`` (a module, a file, a package folder or ``module@folder``); returns its
    module's name."""
    spec = spec.strip()
    module, folder = _parse(spec)
    if folder is not None:
        top = module.split(".")[0]
        loaded = sys.modules.get(top)
        where = _FOLDERS.get(top) or (Path(loaded.__file__).resolve().parent if getattr(loaded, "__file__", None)
                                      and not loaded.__file__.endswith("__init__.py") else None)
        if loaded is not None and where is not None and where != folder:
            raise UsageError(f"cannot import plugin {spec!r}: a module named {top!r} is loaded already, from {where}")
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        _FOLDERS[top] = folder
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if folder is None and error.name == module.split(".")[0]:
            here = Path.cwd()
            if (here / f"{error.name}.py").is_file() or (here / error.name / "__init__.py").is_file():
                return load_plugin(f"{module}@{here}")
            raise UsageError(f"cannot import plugin module {module!r}: no module of that name on Python's path; "
                             f"give its file (--plugin path/to/{error.name}.py) or {module}@FOLDER") from error
        raise UsageError(f"cannot import plugin {spec!r}: {_error_line(error)}") from error
    except (Exception, SystemExit) as error:  # whatever the module raises: a SyntaxError, a KeyError...
        if folder is not None and _FOLDERS.get(module.split(".")[0]) == folder:
            del _FOLDERS[module.split(".")[0]]
        raise UsageError(f"cannot import plugin {spec!r}: {_error_line(error)}") from error
    return module


def _parse(spec: str) -> tuple[str, Path | None]:
    """``(module, folder)`` of a plugin ``spec``; the folder is None for a module imported from Python's path."""
    if not spec:
        raise UsageError("--plugin is empty: give a module (my_attention), a file (path/my_attention.py) or "
                         "module@folder")
    name, at, folder = spec.partition("@")
    if at and _MODULE.fullmatch(name):
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise UsageError(f"plugin {spec!r}: the folder {folder!r} does not exist")
        return name, path.resolve()
    if _MODULE.fullmatch(spec) and not spec.endswith(".py"):
        return spec, None
    if spec.startswith(".") and _MODULE.fullmatch(spec.lstrip(".")):
        raise UsageError(f"plugin {spec!r} is a relative module name: give a module (my_attention), a file "
                         "(path/my_attention.py) or module@folder")
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".py":
        module = path.stem
    elif path.is_dir() and (path / "__init__.py").is_file():
        module = path.resolve().name
    elif path.exists():
        raise UsageError(f"plugin {spec!r} is neither a .py file nor a package folder (one with __init__.py)")
    else:
        raise UsageError(f"plugin {spec!r}: no such file or folder (give a module, a file or module@folder)")
    if not _MODULE.fullmatch(module):
        raise UsageError(f"plugin {spec!r}: {module!r} is not a module name Python can import (letters, digits "
                         "and underscores)")
    return module, path.resolve().parent


def _error_line(error: BaseException) -> str:
    """``"RuntimeError: boom"``: an exception's type and the first line of its message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _distribution(entry) -> str:
    dist = getattr(entry, "dist", None)
    return f"the package {dist.name}" if dist is not None else "an installed package"


# -- which plugin registered what ------------------------------------------------------------------------------

def _registries():
    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.positional import POSITIONAL_ENCODINGS
    from lengthbench.tasks import TASKS

    return (("task", TASKS), ("mechanism", ATTENTION), ("encoding", POSITIONAL_ENCODINGS))


def plugin_of(module: str) -> str | None:
    """How to load ``module`` again, in another process or session: ``module@folder`` where it came from a file
    or folder (so that its working directory and ``sys.path`` do not matter), else ``module``; None for
    lengthbench's own modules."""
    if not module or module.startswith("lengthbench") or module == "__main__":
        return None
    top = module.split(".")[0]
    if top in _FOLDERS:
        return f"{module}@{_FOLDERS[top]}"
    path = getattr(sys.modules.get(module), "__file__", None)
    if "." not in module and path and Path(path).name != "__init__.py":
        return f"{module}@{Path(path).resolve().parent}"
    return module


def plugins_of(config) -> list[str]:
    """The plugins that registered the task, mechanism and encoding of run ``config`` (none for built-in
    names), as :func:`plugin_of` writes them."""
    found = []
    for (_, registry), name in zip(_registries(), (config.task, config.attn, config.pe), strict=True):
        if name in registry:
            plugin = plugin_of(getattr(registry.get(name), "__module__", "") or "")
            if plugin and plugin not in found:
                found.append(plugin)
    return found


def loaded_plugins() -> list[str]:
    """Every loaded plugin that registered something, for the processes that run a sweep's cells to load."""
    found = set()
    for _, registry in _registries():
        for name in registry.names():
            plugin = plugin_of(getattr(registry.get(name), "__module__", "") or "")
            if plugin:
                found.add(plugin)
    return sorted(found)


def check_loaded(config, plugins: Iterable[str], run_id: str) -> None:
    """A one-line :class:`UsageError` where the task, mechanism or encoding of run ``config`` is not registered:
    which plugin the run recorded (``plugins``) and how to load it."""
    plugins = [plugin for plugin in plugins if plugin]
    for (words, registry), name in zip(_registries(), (config.task, config.attn, config.pe), strict=True):
        if name in registry:
            continue
        if plugins:
            hint = "load its plugin: " + " ".join(f"--plugin {_as_option(plugin)}" for plugin in plugins)
        else:
            hint = ("its rows name no plugin: load the module that registers it with --plugin (a module, a file "
                    "or module@folder)")
        raise UsageError(f"run {run_id} uses the {words} {name!r}, which no loaded module registers; {hint}")


def _as_option(plugin: str) -> str:
    """``module@folder`` as the file to pass where the module is a single file there: what a user would type."""
    module, at, folder = plugin.partition("@")
    if at and "." not in module and (Path(folder) / f"{module}.py").is_file():
        return str(Path(folder) / f"{module}.py")
    return plugin
