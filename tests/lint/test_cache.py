"""The content-hash cache: warm runs reuse results, any change of content,
configuration or rules misses."""

from __future__ import annotations

import json

from autoport_cst.lint import lint_paths

BAD = """
class M(nn.Module):
    def forward(self, x):
        return x.cpu()
"""


def run(*paths, **options):
    return lint_paths([str(p) for p in paths], **options)


def test_warm_run_reuses_results(write, in_tmp):
    for i in range(6):
        write(f"m{i}.py", BAD)
    cold = run(".")
    assert cold.cache_hits == 0 and len(cold.diagnostics) == 6
    warm = run(".")
    assert warm.cache_hits == 6
    assert warm.diagnostics == cold.diagnostics
    cache_dir = in_tmp / ".autoport-cst-cache"
    assert (cache_dir / ".gitignore").read_text().strip().endswith("*")


def test_changes_miss(write, in_tmp):
    path = write("m.py", BAD)
    run(".")
    path.write_text(BAD.replace("cpu()", "cpu() + 1"))
    assert run(".").cache_hits == 0
    assert run(".").cache_hits == 1
    assert run(".", select=["NRN003"]).cache_hits == 0, "another rule selection"
    write("pyproject.toml", "[tool.autoport-cst.lint]\nwarnings-as-errors = true\n")
    assert run(".").cache_hits == 0, "another configuration"


def test_renamed_file_hits_with_its_own_path(write, in_tmp):
    write("a.py", BAD)
    run(".")
    (in_tmp / "a.py").rename(in_tmp / "b.py")
    report = run(".")
    assert report.cache_hits == 1
    assert [d.path for d in report.diagnostics] == ["b.py"]


def test_no_cache_and_a_corrupt_cache(write, in_tmp):
    write("m.py", BAD)
    run(".", use_cache=False)
    assert not (in_tmp / ".autoport-cst-cache").exists()
    run(".")
    cache_file = next((in_tmp / ".autoport-cst-cache").glob("lint-v*.json"))
    cache_file.write_text("{not json")
    report = run(".")
    assert report.cache_hits == 0 and len(report.diagnostics) == 1
    assert json.loads(cache_file.read_text())["entries"]


def test_cache_dir_option_and_environment(write, in_tmp, monkeypatch, tmp_path_factory):
    write("m.py", BAD)
    elsewhere = tmp_path_factory.mktemp("cache")
    run(".", cache_dir=str(elsewhere))
    assert list(elsewhere.glob("lint-v*.json"))
    other = tmp_path_factory.mktemp("cache-env")
    monkeypatch.setenv("AUTOPORT_CST_CACHE_DIR", str(other))
    run(".")
    assert list(other.glob("lint-v*.json"))
    assert run(".").cache_hits == 1


def test_memory_cache_reuses_results_in_the_process_only(write, in_tmp):
    path = write("m.py", BAD)
    cold = run(".", use_cache=False, memory_cache=True)
    warm = run(".", use_cache=False, memory_cache=True)
    assert (cold.cache_hits, warm.cache_hits) == (0, 1)
    assert warm.diagnostics == cold.diagnostics and len(warm.diagnostics) == 1
    assert list(in_tmp.iterdir()) == [path], "nothing written on disk"
    assert run(".", use_cache=False, memory_cache=True, select=["NRN003"]).cache_hits == 0, (
        "another rule selection"
    )
    assert run(".", use_cache=False).cache_hits == 0, "no cache at all without memory_cache"
    path.write_text(BAD.replace("cpu()", "cpu() + 1"))
    assert run(".", use_cache=False, memory_cache=True).cache_hits == 0, "another content"
