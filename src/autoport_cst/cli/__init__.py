"""The ``autoport-cst`` command line.

Exit codes (``autoport_cst.cli.common``): 0 done; 1 the result is written
and wrong (a port that does not validate or cannot load a valid checkpoint,
lint violations, ``apply --check`` differences); 2 bad input, usage,
configuration or internal error, with nothing written; 130 interrupted
(Ctrl-C); 141 the reader of the output went away (``| head``), quietly.
Commands are imported lazily so that ``autoport-cst lint`` (a
pre-commit hook) never pays for torch or for the other commands' imports,
and every command checks its input before it imports torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from autoport_cst import __version__
from autoport_cst.cli.common import (
    EXIT_ERROR,
    EXIT_FOUND,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUTPUT_CLOSED,
    exit_output_closed,
    is_output_closed,
    mark_process_ends_with_command,
)
from autoport_cst.errors import did_you_mean

# command name -> "module:attribute" (modules under autoport_cst.cli)
COMMANDS = {
    "apply": "apply_cmd:apply_command",
    "codemods": "codemods_cmd:codemods_command",
    "lint": "lint_cmd:lint_command",
    "plan": "plan_cmd:plan_command",
    "port": "port_cmd:port_command",
    "schema": "schema_cmd:schema_command",
    "smoke": "smoke_cmd:smoke_command",
    "tiny": "validate_cmd:tiny_command",
    "validate": "validate_cmd:validate_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._available(name))

    def _available(self, name: str) -> bool:
        module = COMMANDS[name].split(":")[0]
        return importlib.util.find_spec(f"autoport_cst.cli.{module}") is not None

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not self._available(name):
            return None
        module_name, attr = COMMANDS[name].split(":")
        module = importlib.import_module(f"autoport_cst.cli.{module_name}")
        return getattr(module, attr)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            ctx.fail(f"no such command {name!r}{did_you_mean(name, self.list_commands(ctx))}")
        return super().resolve_command(ctx, args)

    def make_context(self, *args, **kwargs) -> click.Context:
        try:  # --help and --version print here
            return super().make_context(*args, **kwargs)
        except OSError as error:
            if is_output_closed(error):
                exit_output_closed()
            raise

    def invoke(self, ctx: click.Context):
        """Ctrl-C exits 130 wherever it lands; a prompt that meets the end of
        its input is bad input (2), not an internal error; output whose
        reader went away (``| head``) exits 141 quietly (click says 1)."""
        try:
            return super().invoke(ctx)
        except OSError as error:
            if is_output_closed(error):
                exit_output_closed()
            raise
        except KeyboardInterrupt:
            _interrupted()
            ctx.exit(EXIT_INTERRUPTED)
        except click.exceptions.Abort as abort:
            if isinstance(abort.__cause__ or abort.__context__, KeyboardInterrupt):
                _interrupted()
                ctx.exit(EXIT_INTERRUPTED)
            click.echo("error: the input ended where an answer was expected", err=True)
            ctx.exit(EXIT_ERROR)


def _interrupted() -> None:
    click.echo("\ninterrupted (Ctrl-C): stopped; nothing is left half-written", err=True)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autoport-cst")
def cli() -> None:
    """Port Hugging Face decoder models to the vLLM Neuron backend with LibCST
    codemods, check them against Trainium hardware rules, and validate them on
    CPU against transformers.

    Exit codes: 0 done; 1 the port (or file) is written and wrong; 2 bad
    input, nothing written; 130 interrupted; 141 output cut (`| head`)."""


def main() -> None:
    mark_process_ends_with_command()  # exit_now ends the process after the command
    try:
        cli.main(prog_name="autoport-cst", standalone_mode=True)
        code = EXIT_OK
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except KeyboardInterrupt:  # before a command runs (while importing it)
        _interrupted()
        code = EXIT_INTERRUPTED
    exit_now(code)


def _exit_code(code: object) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_ERROR


def exit_now(code: int) -> None:
    """Leave at once once the verdict is out: the atexit handlers run and the
    output is flushed, but the interpreter's teardown (seconds of collecting
    and freeing the torch and transformers objects) is skipped. Output the
    flush cannot write (its reader went away) makes a 0 or 1 a 141."""
    import atexit
    import gc
    import os

    gc.disable()
    gc.freeze()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BrokenPipeError:  # `| head`: the output was cut
                if code in (EXIT_OK, EXIT_FOUND):
                    code = EXIT_OUTPUT_CLOSED
            except (OSError, ValueError):
                pass
        os._exit(code)
