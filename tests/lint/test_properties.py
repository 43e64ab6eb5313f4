"""Property tests on generated, model-shaped modules:

- the findings are exactly those of the violations placed in the module
  (an oracle: each snippet knows what it should produce where it is placed);
- every output format parses;
- after fixing (with --unsafe-fixes), the fixed rules report nothing;
- fixing is idempotent;
- a suppression naming each finding's code silences exactly that finding.

More examples: HYPOTHESIS_PROFILE=thorough.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass

import libcst as cst
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoport_cst.lint import fix_source, lint_source
from autoport_cst.lint.diagnostics import FileResult
from autoport_cst.lint.output import as_json, github, sarif, text

settings.register_profile(
    "default-lint", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default-lint")
if PROFILE not in ("default-lint", "thorough"):
    PROFILE = "default-lint"

# statements for a forward-path body: (code, expected finding on the forward path)
STATEMENTS = [
    ("y = x.to(torch.float32)", None),
    ("y = x.to(self.dtype)", None),
    ("y = x.to(dtype=torch.bfloat16)", None),
    ("y = torch.arange(4, device=x.device)", None),
    ("n = x.shape[0]", None),
    ("y = (x.max() + 1).to(torch.int32)", None),
    ("y = x.to(x.device)", "NRN002"),
    ("y = x.cpu()", "NRN002"),
    ('y = x.to("cpu")', "NRN002"),
    ("n = x.max().item()", "NRN003"),
    ("n = int(x.sum())", "NRN003"),
    ("z = x.tolist()", "NRN003"),
]

ROPE = {
    "lazy": (
        """
class {name}RotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.base = config.rope_theta

    def _compute_inv_freq(self, device):
        return 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=device) / self.head_dim))

    def forward(self, positions, device, dtype):
        freqs = torch.outer(positions.float(), self._compute_inv_freq(device))
        return freqs.cos().to(dtype), freqs.sin().to(dtype)
""",
        [],
    ),
    "eager": (
        """
class {name}RotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2).float() / config.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions, device, dtype):
        freqs = torch.outer(positions.float(), self.inv_freq)
        return freqs.cos().to(dtype), freqs.sin().to(dtype)
""",
        [("NRN001", "error")],
    ),
    "eager-cpu": (
        """
class {name}RotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, device="cpu").float() / config.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions, device, dtype):
        freqs = torch.outer(positions.float(), self.inv_freq)
        return freqs.cos().to(dtype), freqs.sin().to(dtype)
""",
        [("NRN001", "warning")],
    ),
}

BIASES = [
    ("None", False),
    ("self.qkv_proj_bias.unsqueeze(0)", False),
    ("self.qkv_proj_bias.view(1, -1)", False),
    ("self.qkv_proj_bias", True),
    ("self.qkv_proj_bias.unsqueeze(0) if self.qkv_proj_bias is not None else None", False),
    ("self.qkv_proj_bias if self.qkv_proj_bias is not None else None", True),
]

ROUTERS = [("torch.float32", False), ("config.torch_dtype", True), (None, False)]


@dataclass
class Program:
    code: str
    expected: Counter  # (code, severity) -> count


@st.composite
def programs(draw) -> Program:
    name = draw(st.sampled_from(["Llama", "Qwen2", "Mixtral", "Ported"]))
    expected: Counter = Counter()
    parts = ["import torch\nfrom torch import nn\nimport vllm_neuron.functional as NF\n"]

    if draw(st.booleans()):
        rope_kind = draw(st.sampled_from(sorted(ROPE)))
        template, findings = ROPE[rope_kind]
        parts.append(template.format(name=name))
        expected.update(findings)

    # attention: statements in forward, in a helper it calls, in a load-time method
    placed = {
        where: draw(st.lists(st.sampled_from(STATEMENTS), max_size=3))
        for where in ("forward", "helper", "load")
    }
    bias, bias_bad = draw(st.sampled_from(BIASES))
    out_bias, out_bad = draw(st.sampled_from(BIASES))
    out_bias = out_bias.replace("qkv_proj_bias", "o_proj_bias")

    def body(statements):
        lines = [f"        {code}" for code, _ in statements]
        return "\n".join(lines + ["        return x"])

    parts.append(f"""
class {name}Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dtype = config.torch_dtype
        self.qkv_proj_bias = nn.Parameter(torch.zeros(config.qkv_size, dtype=self.dtype))
        self.o_proj_bias = nn.Parameter(torch.zeros(config.hidden_size, dtype=self.dtype))

    def forward(self, x, meta):
{body(placed["forward"])[: -len("        return x")]}        x = self._helper(x)
        return self.forward_decode(x, meta)

    def _helper(self, x):
{body(placed["helper"])}

    def forward_decode(self, x, meta):
        return NF.attention_decode(X=x, bias_qkv={bias}, bias_out={out_bias})

    def load_weights(self, x):
{body(placed["load"])}
""")
    for where in ("forward", "helper"):
        for _, code in placed[where]:
            if code:
                expected[(code, "error")] += 1
    expected[("NRN004", "error")] += int(bias_bad) + int(out_bad)

    if draw(st.booleans()):
        dtype, bad = draw(st.sampled_from(ROUTERS))
        dtype_arg = f", dtype={dtype}" if dtype else ""
        parts.append(f"""
class {name}SparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.router_weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size{dtype_arg}))

    def forward(self, x):
        return x @ self.router_weight.T
""")
        if bad:
            expected[("NRN005", "error")] += 1
    return Program("".join(parts), +expected)


def found(diags) -> Counter:
    return +Counter((d.code, d.severity) for d in diags)


@settings(settings.get_profile(PROFILE))
@given(programs())
def test_findings_match_the_oracle(program):
    assert found(lint_source(program.code, "model.py")) == program.expected, program.code


TEXT = re.compile(r"^[^:]+:\d+:\d+: NRN\d{3}( \[\*\])? .+$")
GITHUB = re.compile(
    r"^::(error|warning) file=[^,]+,line=\d+,col=\d+,endLine=\d+,endColumn=\d+,"
    r"title=NRN\d{3} [a-z0-9-]+::.+$"
)


@settings(settings.get_profile(PROFILE))
@given(programs())
def test_every_output_format_parses(program):
    diags = lint_source(program.code, "pkg/model.py")
    assert all(TEXT.match(line) for line in text(diags).splitlines())
    assert all(GITHUB.match(line) for line in github(diags).splitlines())
    data = json.loads(as_json([FileResult("pkg/model.py", diags)], diags))
    assert [(d["line"], d["column"], d["code"]) for d in data["diagnostics"]] == [
        (d.line, d.column, d.code) for d in diags
    ]
    results = json.loads(sarif(diags))["runs"][0]["results"]
    assert len(results) == len(diags)
    lines = program.code.splitlines()
    for d in diags:
        assert 1 <= d.line <= len(lines) and 1 <= d.column <= len(lines[d.line - 1]) + 1


@settings(settings.get_profile(PROFILE), max_examples=min(25, settings.get_profile(PROFILE).max_examples))
@given(programs())
def test_fixed_rules_report_nothing_and_fixing_is_idempotent(program):
    before = lint_source(program.code, "model.py")
    fixable = {d.code for d in before if d.fix is not None}
    result = fix_source(program.code, "model.py", unsafe=True)
    assert result.fix_problems == [], result.fix_problems
    after = lint_source(result.fixed, "model.py")
    assert not [d for d in after if d.code in fixable], result.fixed
    # the unfixable findings are untouched
    assert found(d for d in after) == found(d for d in before if d.code not in fixable)
    cst.parse_module(result.fixed)
    again = fix_source(result.fixed, "model.py", unsafe=True)
    assert again.fixed == result.fixed


@settings(settings.get_profile(PROFILE))
@given(programs())
def test_suppressing_each_finding_silences_exactly_it(program):
    diags = lint_source(program.code, "model.py")
    by_line: dict[int, set[str]] = {}
    for d in diags:
        by_line.setdefault(d.line, set()).add(d.code)
    lines = program.code.splitlines()
    for number, found_codes in by_line.items():
        codes = ", ".join(sorted(found_codes))
        lines[number - 1] += f"  # autoport: ignore[{codes}] generated test"
    suppressed = "\n".join(lines) + "\n"
    assert lint_source(suppressed, "model.py") == []
