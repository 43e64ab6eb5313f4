"""[tool.autoport-cst.lint] in pyproject.toml: discovery, validation and
effect."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.errors import AutoportError
from autoport_cst.lint import all_rules, load_settings
from autoport_cst.lint.config import parse_table

BAD = """
class M(nn.Module):
    def forward(self, x):
        return x.cpu(), x.item()
"""


def lint(*args):
    return CliRunner().invoke(cli, ["lint", "--no-cache", *map(str, args)])


def test_nearest_pyproject_with_the_table_wins(write, tmp_path):
    write("pyproject.toml", '[tool.autoport-cst.lint]\nignore = ["NRN002"]\n')
    write("sub/pyproject.toml", "[project]\nname = 'x'\n")  # no table: skipped
    write("sub/deeper/pyproject.toml", '[tool.autoport-cst.lint]\nignore = ["NRN003"]\n')
    a = write("sub/a.py", BAD)
    b = write("sub/deeper/b.py", BAD)
    assert load_settings(str(a)).ignore == ("NRN002",)
    assert load_settings(str(b)).ignore == ("NRN003",)
    result = lint(a, b)
    assert result.exit_code == 1
    found = sorted(line.split(": ")[1].split()[0] for line in result.stdout.splitlines())
    assert found == ["NRN002", "NRN003"]


def test_unknown_keys_are_errors_with_their_key(write):
    write("pyproject.toml", '[tool.autoport-cst.lint]\nselekt = ["NRN001"]\n')
    path = write("m.py", BAD)
    result = lint(path)
    assert result.exit_code == 2
    assert "tool.autoport-cst.lint.selekt" in result.stderr
    assert "unknown key 'selekt'" in result.stderr


@pytest.mark.parametrize(
    "table,message",
    [
        ({"lint": {"select": "NRN001"}}, "expected a list of strings"),
        ({"lint": {"select": ["NRN123"]}}, "matches no rule"),
        ({"lint": {"warnings-as-errors": "yes"}}, "expected true or false"),
        ({"lint": {"options": {"NRN777": {}}}}, "unknown rule"),
        ({"lint": {"options": {"NRN005": {"allowed": []}}}}, "unknown option 'allowed'"),
        ({"lint": {"options": {"NRN005": {"allow": "x"}}}}, "expected a list of strings"),
        ({"lint": {"per-file-ignores": {"*.py": "NRN001"}}}, "expected a list"),
        ({"lint": {"per-file-ignores": {"*.py": ["NRNX"]}}}, "matches no rule"),
        ({"lnt": {}}, "unknown key 'lnt'"),
        ({"lint": []}, "expected a table"),
    ],
)
def test_invalid_tables(table, message):
    with pytest.raises(AutoportError) as info:
        parse_table(table, "/p/pyproject.toml")
    assert message in str(info.value)


def test_several_problems_are_reported_together():
    with pytest.raises(AutoportError) as info:
        parse_table({"lint": {"a": 1, "b": 2}}, "/p/pyproject.toml")
    assert "unknown key 'a'" in str(info.value) and "unknown key 'b'" in str(info.value)


def test_other_command_sections_are_accepted():
    settings = parse_table({"apply": {"anything": 1}, "lint": {"select": ["NRN00"]}}, "/p/x.toml")
    prefixed = {code for code in all_rules() if code.startswith("NRN00")}
    assert {"NRN001", "NRN005"} <= prefixed
    assert settings.enabled() == prefixed | {"NRN999"}


def test_invalid_toml_is_exit_2(write):
    write("pyproject.toml", "[tool.autoport-cst\n")
    result = lint(write("m.py", BAD))
    assert result.exit_code == 2 and "invalid TOML" in result.stderr


def test_per_file_ignores_exclude_and_force_exclude(write, in_tmp):
    write(
        "pyproject.toml",
        """
        [tool.autoport-cst.lint]
        exclude = ["generated/**"]
        per-file-ignores = { "legacy/*.py" = ["no-item-in-forward"] }
        """,
    )
    write("legacy/old.py", BAD)
    write("generated/gen.py", BAD)
    write("model.py", BAD)
    result = lint(".")
    lines = result.stdout.splitlines()
    assert not any(line.startswith("generated/") for line in lines)
    assert any(line.startswith("legacy/old.py") and "NRN002" in line for line in lines)
    assert not any(line.startswith("legacy/old.py") and "NRN003" in line for line in lines)
    assert sum(line.startswith("model.py") for line in lines) == 2
    # named explicitly, an excluded file is linted unless --force-exclude
    assert lint("generated/gen.py").exit_code == 1
    forced = lint("--force-exclude", "generated/gen.py")
    assert forced.exit_code == 0 and forced.stdout == ""


def test_rule_options_reach_the_rules(write):
    write(
        "pyproject.toml",
        """
        [tool.autoport-cst.lint.options.router-float32]
        allow = ["GptOssExperts.router_weight"]
        """,
    )
    path = write(
        "m.py",
        """
        class GptOssExperts(nn.Module):
            def __init__(self, c):
                self.router_weight = nn.Parameter(torch.empty(8, 4, dtype=c.dtype))
        """,
    )
    assert lint(path).exit_code == 0
    assert lint("--config", "/dev/null", path).exit_code == 2  # not a file


def test_explicit_config_and_select_override(write, tmp_path):
    cfg = write("conf/pyproject.toml", '[tool.autoport-cst.lint]\nselect = ["NRN003"]\n')
    path = write("m.py", BAD)
    result = lint("--config", cfg, path)
    assert [line.split()[1] for line in result.stdout.splitlines()] == ["NRN003"]
    result = lint("--config", cfg, "--select", "NRN002", path)
    assert [line.split()[1] for line in result.stdout.splitlines()] == ["NRN002"]
    assert lint("--config", tmp_path / "missing.toml", path).exit_code == 2
