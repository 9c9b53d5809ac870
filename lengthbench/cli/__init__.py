"""The ``lengthbench`` command: typer + rich.

Each command group lives in its own module with a ``register(app)`` function; ``COMMAND_MODULES``
lists them. Bad input (unknown names, numbers out of range, folders that are missing, are files or cannot
be written) ends in a one-line error and exit code 2, never a traceback; commands check the folders they
write before any work starts (``lengthbench.validation``).
"""

from __future__ import annotations

import functools
import importlib
import sys
from inspect import Parameter, signature

import typer
from rich.console import Console
from rich.markup import escape

from lengthbench.errors import TrainingDiverged, UsageError, interrupted
from lengthbench.models.registry import UnknownNameError
from lengthbench.plugins import HELP as PLUGIN_HELP
from lengthbench.plugins import load_plugins
from lengthbench.store import StoreError

console = Console(stderr=True)
app = typer.Typer(
    help="lengthbench: train small decoders at length 64, score exact match up to 1024x.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = ["run", "registry", "tasks", "inspect", "sweep", "check", "results", "html"]


@app.callback()
def root(plugin: list[str] = typer.Option([], "--plugin", help=PLUGIN_HELP)) -> None:
    # the plugins of the root --plugin, of LENGTHBENCH_PLUGINS and of installed entry points
    load_plugins(plugin, environment=True, entry_points=True)


def _with_plugin_option(callback):
    """``callback`` with a ``--plugin`` option that loads the plugins before the command runs (a command that
    has its own ``plugin`` parameter is left as it is)."""
    # (``inspect`` here is the command module lengthbench.cli.inspect)
    parameters = signature(callback).parameters
    if "plugin" in parameters:
        return callback

    @functools.wraps(callback)
    def command(*args, plugin: list[str], **kwargs):
        load_plugins(plugin)
        return callback(*args, **kwargs)

    option = Parameter("plugin", Parameter.KEYWORD_ONLY, annotation=list[str],
                       default=typer.Option([], "--plugin", help=PLUGIN_HELP))
    command.__signature__ = signature(callback).replace(parameters=[*parameters.values(), option])
    command.__annotations__ = {**callback.__annotations__, "plugin": list[str]}
    return command


def _add_plugin_option(typer_app: typer.Typer) -> None:
    """``--plugin`` on every command of ``typer_app`` and its groups: each command loads mechanisms, encodings or
    tasks by name, so each takes the plugins that register them."""
    for info in typer_app.registered_commands:
        info.callback = _with_plugin_option(info.callback)
    for group in typer_app.registered_groups:
        _add_plugin_option(group.typer_instance)


def reflow_help(typer_app: typer.Typer) -> None:
    """Every command's help (its docstring unless given) with each paragraph on one line, so that rich wraps it to
    the terminal: typer keeps the docstring's own line breaks after the first paragraph."""
    import inspect

    for command in typer_app.registered_commands:
        text = command.help or inspect.getdoc(command.callback) or ""
        command.help = "\n\n".join(" ".join(line.strip() for line in paragraph.splitlines())
                                   for paragraph in text.split("\n\n"))
    for group in typer_app.registered_groups:
        reflow_help(group.typer_instance)


for _name in COMMAND_MODULES:
    importlib.import_module(f"lengthbench.cli.{_name}").register(app)
reflow_help(app)
_add_plugin_option(app)


def fail(message: str) -> None:
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip()) or "failed"
    # escaped: a message's own brackets ("pip install 'lengthbench[ray]'", "[overrides]") are text, not markup
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise SystemExit(2)


def _interrupted() -> None:
    console.print("interrupted: rerun the same command to continue (`lengthbench run` needs --resume)",
                  highlight=False, soft_wrap=True)
    raise SystemExit(130) from None


def main() -> None:
    try:
        # Without standalone mode, click returns (not raises) the code of a typer.Exit.
        code = app(standalone_mode=False)
        if code == 130:  # typer turns a KeyboardInterrupt into this code, silently
            _interrupted()
        if isinstance(code, int) and code:
            raise SystemExit(code)
    except UnknownNameError as error:  # a LookupError: its str() comes in quotes
        fail(str(error).strip("'\"") + "; one of your own: load its module with --plugin")
    except UsageError as error:  # (a message may end in a quoted name: keep it)
        fail(str(error))
    except ValueError as error:  # impossible arguments found by the configuration or a generator
        fail(str(error))
    except OSError as error:  # a folder that is a file, no permission, a name too long, a full disk...
        from lengthbench.validation import os_error_message

        fail(os_error_message(error) if error.errno is not None else str(error))
    except StoreError as error:  # a results folder that cannot be used
        fail(str(error))
    except (OverflowError, MemoryError) as error:  # a number too large for what it feeds
        fail(f"a value is too large: {error}" if str(error) else "a value is too large for memory")
    except TrainingDiverged as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        raise SystemExit(1) from None
    except typer.Exit as error:
        raise SystemExit(error.exit_code) from None
    except typer.Abort:
        console.print("aborted")
        raise SystemExit(130) from None
    except (KeyboardInterrupt, Exception) as error:
        if interrupted(error):  # (inside a compiled step the interrupt can surface as another error)
            _interrupted()
        # Usage errors of the command-line parser (click's, or the copy bundled with newer typer)
        # carry an exit code and a message; anything else is a bug and keeps its traceback.
        if hasattr(error, "format_message") and hasattr(error, "exit_code"):
            if error.exit_code == 0:
                raise SystemExit(0) from None
            console.print(f"[bold red]error:[/] {error.format_message()}", highlight=False, soft_wrap=True)
            raise SystemExit(error.exit_code) from None
        raise

if __name__ == "__main__":
    main()
    sys.exit(0)
