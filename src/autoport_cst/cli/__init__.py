"""The ``autoport-cst`` command line.

Exit codes follow ruff: 0 success / clean, 1 violations or differences found
(``lint``, ``apply --check``, ``validate`` not equivalent), 2 bad input, usage,
configuration or internal error. Commands are imported lazily so that
``autoport-cst lint`` (a pre-commit hook) never pays for torch or for the other
commands' imports.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from autoport_cst import __version__

# command name -> "module:attribute" (modules under autoport_cst.cli)
COMMANDS = {
    "apply": "apply_cmd:apply_command",
    "codemods": "codemods_cmd:codemods_command",
    "lint": "lint_cmd:lint_command",
    "plan": "plan_cmd:plan_command",
    "port": "port_cmd:port_command",
    "schema": "schema_cmd:schema_command",
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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autoport-cst")
def cli() -> None:
    """Port Hugging Face decoder models to the vLLM Neuron backend with LibCST
    codemods, check them against Trainium hardware rules, and validate them on
    CPU against transformers."""


def main() -> None:
    try:
        cli.main(prog_name="autoport-cst", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(2)
