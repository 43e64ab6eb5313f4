"""`autoport-cst lint`: exit codes, output formats, selection, fixes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from click.testing import CliRunner

from autoport_cst.cli import cli

TEXT_LINE = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<code>NRN\d{3})( \[\*\])? (?P<msg>.+)$"
)

FORWARD_BAD = """
class M(nn.Module):
    def forward(self, x):
        y = x.cpu()
        return y.item()
"""


def lint(*args):
    return CliRunner().invoke(cli, ["lint", *map(str, args)])


def test_exit_0_on_clean_input(write, in_tmp, clean_source):
    write("clean.py", clean_source)
    result = lint("clean.py")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "All checks passed" in result.stderr


def test_exit_1_and_text_format(write, in_tmp):
    write("pkg/bad.py", FORWARD_BAD)
    result = lint()  # default path: .
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    parsed = [TEXT_LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [(m["path"], m["line"], m["col"], m["code"]) for m in parsed] == [
        ("pkg/bad.py", "3", "15", "NRN002"),
        ("pkg/bad.py", "4", "18", "NRN003"),
    ]
    # 1-based columns: column 15 is the `c` of `cpu`
    source = (in_tmp / "pkg/bad.py").read_text().splitlines()
    assert source[2][15 - 1 :].startswith("cpu")
    assert "Found 2 errors" in result.stderr


def test_exit_zero(write, in_tmp):
    write("bad.py", FORWARD_BAD)
    result = lint("--exit-zero", "bad.py")
    assert result.exit_code == 0 and "NRN002" in result.stdout


def test_usage_and_input_errors_exit_2(write, in_tmp):
    write("bad.py", FORWARD_BAD)
    assert lint("missing.py").exit_code == 2
    assert lint("--select", "NRN123", "bad.py").exit_code == 2
    assert lint("--output-format", "xml", "bad.py").exit_code == 2
    assert lint("--bogus").exit_code == 2


def test_syntax_error_is_a_diagnostic(write, in_tmp):
    write("broken.py", "def forward(self, x:\n    return x\n")
    write("ok.py", "x = 1\n")
    result = lint(".")
    assert result.exit_code == 1
    assert result.stdout.startswith("broken.py:1:12: NRN999 syntax error")


def test_select_and_ignore(write, in_tmp):
    write("bad.py", FORWARD_BAD)
    only = lint("--select", "NRN003", "bad.py")
    assert [TEXT_LINE.match(x)["code"] for x in only.stdout.splitlines()] == ["NRN003"]
    skip = lint("--ignore", "no-item-in-forward,NRN9", "bad.py")
    assert [TEXT_LINE.match(x)["code"] for x in skip.stdout.splitlines()] == ["NRN002"]
    none = lint("--select", "NRN002", "--ignore", "NRN002", "bad.py")
    assert none.exit_code == 0


def test_json_output_parses(write, in_tmp):
    write("bad.py", FORWARD_BAD)
    result = lint("--output-format", "json", "bad.py")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["version"] == 1
    assert data["summary"]["errors"] == 2
    first = data["diagnostics"][0]
    assert {k: first[k] for k in ("path", "line", "column", "code", "name")} == {
        "path": "bad.py",
        "line": 3,
        "column": 15,
        "code": "NRN002",
        "name": "no-device-move-in-forward",
    }
    assert first["end_line"] == 3 and first["end_column"] == 18


def test_sarif_output(write, in_tmp):
    write("bad.py", FORWARD_BAD)
    data = json.loads(lint("--output-format", "sarif", "bad.py").stdout)
    assert data["version"] == "2.1.0"
    run = data["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} >= {"NRN001", "NRN002", "NRN003", "NRN004", "NRN005"}
    result = run["results"][0]
    assert result["ruleId"] == "NRN002" and result["level"] == "error"
    assert rules[result["ruleIndex"]]["id"] == "NRN002"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 3, "startColumn": 15, "endLine": 3, "endColumn": 18}
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad.py"


def test_github_output(write, in_tmp):
    write("bad.py", FORWARD_BAD)
    lines = lint("--output-format", "github", "bad.py").stdout.splitlines()
    assert lines[0].startswith(
        "::error file=bad.py,line=3,col=15,endLine=3,endColumn=18,title=NRN002 no-device-move-in-forward::"
    )
    assert len(lines) == 2


def test_statistics(write, in_tmp):
    write("a.py", FORWARD_BAD)
    write("b.py", FORWARD_BAD)
    result = lint("--statistics", ".")
    assert result.exit_code == 1
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["2", "NRN002", "no-device-move-in-forward"],
        ["2", "NRN003", "no-item-in-forward"],
    ]
    data = json.loads(lint("--statistics", "--output-format", "json", ".").stdout)
    assert data[0] == {"code": "NRN002", "name": "no-device-move-in-forward", "count": 2, "fixable": False}


def test_warnings_do_not_fail_the_run(write, in_tmp):
    write(
        "rope.py",
        """
        class RotaryEmbedding(nn.Module):
            def __init__(self, d):
                self.register_buffer("inv_freq", torch.arange(d, device="cpu"), persistent=False)
        """,
    )
    result = lint("rope.py")
    assert result.exit_code == 0
    assert "NRN001 warning:" in result.stdout  # no forward: lazy-rope cannot fix it
    assert "1 warning" in result.stderr
    write("pyproject.toml", "[tool.autoport-cst.lint]\nwarnings-as-errors = true\n")
    assert lint("--no-cache", "rope.py").exit_code == 1


def test_fix_writes_and_reports(write, in_tmp, violating_source):
    path = write("rope.py", violating_source)
    diff = lint("--diff", "rope.py")
    assert diff.exit_code == 1
    assert diff.stdout.startswith("--- a/rope.py\n+++ b/rope.py\n")
    assert "+    def _compute_inv_freq(self, device):" in diff.stdout
    assert path.read_text() == violating_source, "--diff writes nothing"

    fixed = lint("--fix", "rope.py")
    # NRN002 (.to(x.device)) has no fix and remains
    assert fixed.exit_code == 1
    assert [TEXT_LINE.match(x)["code"] for x in fixed.stdout.splitlines()] == ["NRN002"]
    assert "_compute_inv_freq" in path.read_text()
    assert "Fixed 1 violation in 1 file" in fixed.stderr

    again = lint("--fix", "--exit-non-zero-on-fix", "--ignore", "NRN002", "rope.py")
    assert again.exit_code == 0, "nothing left to fix: no change"


def test_exit_non_zero_on_fix(write, in_tmp, violating_source):
    write("rope.py", violating_source)
    plain = lint("--fix", "--ignore", "NRN002", "rope.py")
    assert plain.exit_code == 0
    write("rope.py", violating_source)
    strict = lint("--fix", "--ignore", "NRN002", "--exit-non-zero-on-fix", "rope.py")
    assert strict.exit_code == 1


ROUTER = """
class Qwen3MoeExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.router_weight = nn.Parameter(torch.empty(config.E, config.H, dtype=config.torch_dtype))
"""


def test_unsafe_fixes_are_opt_in(write, in_tmp):
    path = write("moe.py", ROUTER)
    listed = lint("moe.py")
    assert "NRN005 router" in listed.stdout, "no [*]: the fix is unsafe"
    assert "1 more fixable with --unsafe-fixes" in listed.stderr
    assert lint("--fix", "moe.py").exit_code == 1
    assert "config.torch_dtype" in path.read_text()
    assert lint("--fix", "--unsafe-fixes", "moe.py").exit_code == 0
    assert "dtype=torch.float32" in path.read_text()


def test_internal_error_exits_2(write, in_tmp, monkeypatch):
    from autoport_cst.lint.rules.no_item_in_forward import NoItemInForward

    def boom(self, node):
        raise RuntimeError("rule bug")

    monkeypatch.setattr(NoItemInForward, "visit_Call", boom)
    write("m.py", "def f():\n    g()\n")
    result = lint("--no-cache", "m.py")
    assert result.exit_code == 2
    assert "internal error: RuntimeError: rule bug" in result.stderr


def test_explain_and_list_rules():
    listed = lint("--list-rules")
    assert listed.exit_code == 0 and "NRN004  decode-bias-2d" in listed.stdout
    explained = lint("--explain", "no-item-in-forward")
    assert explained.exit_code == 0 and "Why:" in explained.stdout
    assert lint("--explain", "NRN777").exit_code == 2


def test_console_script_end_to_end_without_torch(write, tmp_path):
    """The real entry point in a subprocess: diagnostics on stdout, summary on
    stderr, exit 1, and neither torch nor transformers imported."""
    path = write("bad.py", FORWARD_BAD)
    probe = (
        "import sys, atexit\n"
        "atexit.register(lambda: sys.stderr.write('HEAVY=' + ','.join(sorted("
        "m for m in ('torch', 'transformers') if m in sys.modules)) + '\\n'))\n"
        "from autoport_cst.cli import main\n"
        f"sys.argv = ['autoport-cst', 'lint', '--no-cache', {str(path)!r}]\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert "NRN002" in proc.stdout and "NRN003" in proc.stdout
    assert "Found 2 errors" in proc.stderr and "Found" not in proc.stdout
    assert "HEAVY=\n" in proc.stderr


def test_importing_the_library_does_not_import_torch():
    code = (
        "import sys\n"
        "import autoport_cst.lint as lint\n"
        "lint.lint_source('class M(nn.Module):\\n    def forward(self, x):\\n        return x.cpu()\\n')\n"
        "lint.all_rules()\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
