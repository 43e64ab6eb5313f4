"""``python -m autoport_cst.lint [PATHS...]``: the lint command without the
command group (the entry of the pre-commit hooks; same options and exit
codes as ``autoport-cst lint``)."""

from autoport_cst.cli.lint_cmd import lint_command

if __name__ == "__main__":
    lint_command.main(prog_name="autoport-cst lint")
