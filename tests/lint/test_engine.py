"""The engine: forward-path and init-path determination, positions,
suppressions, syntax errors and the library API."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from autoport_cst.errors import AutoportError
from autoport_cst.lint import Diagnostic, lint_source
from autoport_cst.lint.config import LintSettings
from autoport_cst.lint.engine import LintContext, walk
from autoport_cst.lint.positions import positions

from .conftest import ROOT, transformers_models_dir


def analyze(code: str) -> LintContext:
    module = cst.parse_module(textwrap.dedent(code))
    ctx = LintContext("m.py", module, LintSettings())
    walk(ctx, module, [])
    ctx.index.finalize()
    return ctx


def forward_names(code: str, **kwargs) -> set[str]:
    ctx = analyze(code)
    return {fn.qualname for fn in ctx.index.forward_path(**kwargs)}


def codes(code: str, **kwargs) -> list[tuple[str, int, int]]:
    return [(d.code, d.line, d.column) for d in lint_source(textwrap.dedent(code), **kwargs)]


# -- forward path ----------------------------------------------------------------------


def test_forward_path_follows_calls_within_the_file():
    names = forward_names(
        """
        def _apply_rotary_emb(x):
            return _rotate(x)

        def _rotate(x):
            return x

        def _unused(x):
            return x

        class Attention(nn.Module):
            def forward(self, x, meta):
                if self._is_decode(meta):
                    return self.forward_decode(x)
                return self.forward_prefill(x)

            def forward_prefill(self, x):
                def _write_kv_cache(k):
                    return k
                return _apply_rotary_emb(x)

            def forward_decode(self, x):
                return Helper.static(x) + self.scale

            def _is_decode(self, meta):
                return True

            @property
            def scale(self):
                return 2

            def load_weights(self, path):
                return self._cast_to_model_dtype(path)

            def _cast_to_model_dtype(self, state):
                return state

            def get_kv_spec(self):
                return None

        class Helper:
            @staticmethod
            def static(x):
                return x
        """
    )
    assert names == {
        "Attention.forward",
        "Attention.forward_prefill",
        "Attention.forward_prefill._write_kv_cache",
        "Attention.forward_decode",
        "Attention._is_decode",
        "Attention.scale",
        "_apply_rotary_emb",
        "_rotate",
        "Helper.static",
    }


def test_forward_path_excludes_load_time_methods_even_when_called():
    names = forward_names(
        """
        class Model(nn.Module):
            def forward(self, x):
                self.load_weights("p")
                self._load_kv_cache_scales()
                self.bind_kv_cache({})
                self.__init__()
                return self._debug(x)

            def load_weights(self, path): ...
            def _load_kv_cache_scales(self): ...
            def bind_kv_cache(self, caches): ...
            def __init__(self): ...

            @torch.compiler.disable
            def _debug(self, x): ...
        """
    )
    assert names == {"Model.forward"}


def test_forward_path_super_overrides_and_config():
    code = """
        class Base(nn.Module):
            def forward(self, x):
                return self.step(x)

            def step(self, x):
                return x

        class Child(Base):
            def step(self, x):
                return super().step(x)

            def run_step(self, x):
                return self.trace(x)

            def trace(self, x):
                return x
        """
    assert forward_names(code) == {"Base.forward", "Base.step", "Child.step"}
    assert forward_names(code, extra_roots=("run_step",)) >= {"Child.run_step", "Child.trace"}
    assert "Base.step" not in forward_names(code, extra_excluded=("step",))


def test_configured_forward_roots_reach_the_rules():
    code = """
        class M(nn.Module):
            def run_step(self, x):
                return x.item()
        """
    assert codes(code) == []
    settings = LintSettings(forward_roots=("run_step",))
    assert [d.code for d in lint_source(textwrap.dedent(code), settings=settings)] == ["NRN003"]


def test_nn_module_detection():
    ctx = analyze(
        """
        class A(nn.Module): pass
        class B(A): pass
        class C(LlamaAttention): pass
        class D(PreTrainedModel): pass
        class E(LlamaConfig): pass
        class F: pass
        class G(torch.nn.Linear): pass
        """
    )
    found = {c.name: ctx.index.is_module(c) for c in ctx.index.classes}
    assert found == {"A": True, "B": True, "C": True, "D": True, "E": False, "F": False, "G": True}


# -- positions ----------------------------------------------------------------------------


def _sample_files() -> list:
    files = [ROOT / "reference_models" / "llama3" / "model.py"]
    models = transformers_models_dir()
    if models is not None:
        for name in (
            "llama/modeling_llama.py",
            "qwen3_moe/modeling_qwen3_moe.py",
            "gpt_oss/modeling_gpt_oss.py",
        ):
            if (models / name).is_file():
                files.append(models / name)
    return files


@pytest.mark.parametrize("path", _sample_files(), ids=lambda p: p.name)
def test_targeted_positions_match_position_provider(path):
    from libcst.metadata import MetadataWrapper, PositionProvider

    source = path.read_text()
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes = list(expected)[::7]
    got = positions(module, nodes)
    for node in nodes:
        rng = expected[node]
        assert got[id(node)] == (rng.start.line, rng.start.column, rng.end.line, rng.end.column)
    # the per-statement path agrees with the whole-module path
    tops = [s for s in module.body if any(True for _ in [s])]
    some = nodes[::5]
    by_statement = positions(module, some, tops, source)
    assert {k: by_statement[k] for k in (id(n) for n in some)} == {id(n): got[id(n)] for n in some}


def test_columns_are_one_based():
    diags = lint_source("class M(nn.Module):\n    def forward(self, x):\n        return x.cpu()\n")
    assert [(d.line, d.column, d.end_column) for d in diags] == [(3, 18, 21)]


# -- suppressions ------------------------------------------------------------------------------

BODY = """
class M(nn.Module):
    def forward(self, x):
        {line}
"""


@pytest.mark.parametrize(
    "line,expected",
    [
        ("return x.cpu()  # autoport: ignore[NRN002] host copy is the point", []),
        ("return x.cpu()  # autoport: ignore[no-device-move-in-forward] by name", []),
        ("return x.cpu()  # autoport: ignore[NRN002,NRN003] both", ["NRN901"]),
        ("return x.cpu()  # autoport: ignore[NRN003] wrong code", ["NRN002", "NRN901"]),
        ("return x.cpu()  # autoport: ignore", ["NRN002", "NRN900"]),
        ("return x.cpu()  # autoport: ignore[] empty", ["NRN002", "NRN900"]),
        ("return x.cpu()  # autoport: ignore[NRN002]", ["NRN900"]),
        ("return x.cpu()  # noqa", ["NRN002"]),
        ('return "# autoport: ignore[NRN002] in a string", x.cpu()', ["NRN002"]),
    ],
)
def test_suppression_forms(line, expected):
    code = textwrap.dedent(BODY).format(line=line)
    assert sorted(d.code for d in lint_source(code)) == sorted(expected)


def test_suppression_above_and_on_the_statement_line():
    code = textwrap.dedent(
        """
        class M(nn.Module):
            def forward(self, x):
                # autoport: ignore[NRN002] the host table is small
                # (and this comment block continues)
                a = x.to(
                    "cpu"
                )
                b = torch.stack([  # autoport: ignore[NRN003] debug build only
                    x.item(),
                ])
                c = x.cpu()
                return a, b, c
        """
    )
    assert [(d.code, d.line) for d in lint_source(code)] == [("NRN002", 12)]


def test_unused_suppression_is_not_reported_for_rules_that_did_not_run():
    code = textwrap.dedent(BODY).format(line="return x  # autoport: ignore[NRN002] old")
    assert [d.code for d in lint_source(code)] == ["NRN901"]
    assert [d.code for d in lint_source(code, select=["NRN003", "NRN901"])] == []


# -- syntax errors and the API --------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    ["def f(:\n", "class A:\nreturn 1\n", b"x = '\xff\xfe'\n", "x = (1,\n", "\tif x:\n  pass\n"],
)
def test_syntax_errors_are_diagnostics(source):
    diags = lint_source(source, "bad.py")
    assert len(diags) == 1
    assert diags[0].code == "NRN999" and diags[0].path == "bad.py"
    assert diags[0].line >= 1 and diags[0].column >= 1


def test_lint_source_accepts_bytes_and_reports_the_path():
    diags = lint_source(
        b"class M(nn.Module):\n    def forward(self, x):\n        return x.cpu()\n", path="pkg/model.py"
    )
    assert isinstance(diags[0], Diagnostic)
    assert diags[0].path == "pkg/model.py"
    assert diags[0].to_dict()["code"] == "NRN002"


def test_lint_source_select_ignore_and_options():
    code = textwrap.dedent(
        """
        class GptOssExperts(nn.Module):
            def __init__(self, c):
                self.router_weight = nn.Parameter(torch.empty(8, 4, dtype=c.dtype))
                self.k_scale = torch.ones(1)
        """
    )
    assert [d.code for d in lint_source(code)] == ["NRN005", "NRN001"]
    assert [d.code for d in lint_source(code, select=["NRN005"])] == ["NRN005"]
    assert [d.code for d in lint_source(code, ignore=["router-float32"])] == ["NRN001"]
    allow = {"NRN005": {"allow": ["GptOssExperts.router_weight"]}}
    assert [d.code for d in lint_source(code, options=allow)] == ["NRN001"]
    with pytest.raises(AutoportError, match="unknown option"):
        lint_source(code, options={"NRN005": {"allowed": []}})
    with pytest.raises(AutoportError, match="matches no rule"):
        lint_source(code, select=["NRN123"])


def test_diagnostics_are_sorted_and_deduplicated():
    code = textwrap.dedent(
        """
        class M(nn.Module):
            def forward(self, x):
                return self.a(x), self.a(x).cpu()

            def a(self, x):
                return x.item()
        """
    )
    diags = lint_source(code)
    assert [(d.code, d.line) for d in diags] == [("NRN002", 4), ("NRN003", 7)]


def test_warnings_as_errors():
    code = textwrap.dedent(
        """
        class RotaryEmbedding(nn.Module):
            def __init__(self, d):
                self.register_buffer("inv_freq", torch.arange(d, device="cpu"), persistent=False)
        """
    )
    assert [d.severity for d in lint_source(code)] == ["warning"]
    strict = LintSettings(warnings_as_errors=True)
    assert [d.severity for d in lint_source(code, settings=strict)] == ["error"]


def test_a_crashing_rule_is_an_internal_error_not_a_finding(monkeypatch):
    from autoport_cst.lint.rules.no_item_in_forward import NoItemInForward
    from autoport_cst.lint.runner import lint_one

    def boom(self, node):
        raise RuntimeError("rule bug")

    monkeypatch.setattr(NoItemInForward, "visit_Call", boom)
    result = lint_one("m.py", b"def f():\n    g()\n", LintSettings(), LintSettings().enabled())
    assert result.diagnostics == []
    assert "internal error: RuntimeError: rule bug" in result.error
