"""config-key-aliases: the config reads fields that config.json writes under other names."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.config import config_class, method_of
from autoport_cst.transform.anatomy.config_values import CONVENTIONAL, config_values
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import walk
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.tree import insert_after, with_comment

FUNCTION = "_read_config_keys"
COMMENT = "<-- MODEL-SPECIFIC: config.json names these fields otherwise"
# arithmetic a source may use besides config.json keys and numbers
_OPERATORS = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power)


@dataclass(frozen=True)
class ConfigKeyAliasesParams:
    keys: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "Port field -> a config.json key, '<key> or <expression>' or '<expression>': arithmetic "
            "(+ - * / // **, parentheses) of config.json keys and numbers, used when the key is unset (a width "
            "the code builds as a multiple of another field, a multiplier computed from several fields).",
            "examples": (
                {"hidden_size": "n_embd", "intermediate_size": "n_inner or 4 * n_embd"},
                {"partial_rotary_factor": "rotary_dim / (n_embd / n_head)"},
                {
                    "residual_multiplier": "scale_depth / num_hidden_layers ** 0.5",
                    "embedding_multiplier": "scale_emb",
                },
            ),
        },
    )


class ConfigKeyAliases(Codemod):
    """Read the config fields the port needs under the names config.json
    writes them (transformers' ``attribute_map``).

    GPT-J's config.json writes ``n_embd``, ``n_head``, ``n_layer`` and
    ``n_positions``; transformers reads them as ``hidden_size``, ... through
    ``GPTJConfig.attribute_map``, and its MLP is ``n_inner`` wide, or ``4 *
    n_embd`` when ``n_inner`` is null; it rotates ``rotary_dim`` channels of
    each head (``partial_rotary_factor = rotary_dim / (n_embd // n_head)``).
    MiniCPM3 computes its residual multiplier as ``scale_depth /
    sqrt(num_hidden_layers)`` (``**`` and float literals are allowed), its
    embedding multiplier is ``scale_emb`` and its ``logits_scaling`` a config
    property ``hidden_size / dim_model_base``: the port computes each from the
    checkpoint's config.json, so a config with other values reads its own.
    In the config file, a module function ``_read_config_keys(values)`` copies
    each key to the port's field when the field is absent or null, then
    computes each field still unset whose keys are set; ``from_configs``
    calls it on the config values before it first reads them.

    The dict is the one config-guards reads
    (``autoport_cst.transform.anatomy.config_values``): ``values`` in our
    references, ``config_dict`` (bound in an ``if``/``elif``/``else`` on the
    config's type) in the real vllm_neuron packages; the call goes right
    after the statement that binds it on every path.

    Precondition: a config dataclass whose ``from_configs`` binds that dict
    on every path before reading it.
    """

    ID = "config-key-aliases"
    REALIZES = ("checkpoint.config_keys",)
    Params = ConfigKeyAliasesParams
    FILES = ("config",)
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="GPT-J",
            role="config",
            path="config.py",
            params={"keys": {"hidden_size": "n_embd", "intermediate_size": "n_inner or 4 * n_embd"}},
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096

                    @classmethod
                    def from_configs(cls, hf_config):
                        values = _config_values(hf_config)
                        values["rope_parameters"] = _rope_parameters(values)
                        return cls(**values)
            """,
            after='''
                def _read_config_keys(values: dict) -> None:
                    """The fields this port reads that config.json writes under other names."""
                    for name, key in {"hidden_size": "n_embd", "intermediate_size": "n_inner"}.items():
                        if values.get(name) is None and values.get(key) is not None:
                            values[name] = values[key]
                    if _unset(values, "intermediate_size", "n_embd"):
                        values["intermediate_size"] = 4 * values["n_embd"]


                def _unset(values: dict, name: str, *keys: str) -> bool:
                    """``name`` is unset and every key it is computed from is set."""
                    return values.get(name) is None and all(values.get(key) is not None for key in keys)


                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096

                    @classmethod
                    def from_configs(cls, hf_config):
                        values = _config_values(hf_config)
                        # <-- MODEL-SPECIFIC: config.json names these fields otherwise
                        _read_config_keys(values)
                        values["rope_parameters"] = _rope_parameters(values)
                        return cls(**values)
            ''',
        ),
        Example(
            title="MiniCPM3: multipliers computed from other fields",
            role="config",
            path="config.py",
            params={
                "keys": {
                    "residual_multiplier": "scale_depth / num_hidden_layers ** 0.5",
                    "embedding_multiplier": "scale_emb",
                }
            },
            before="""
                @dataclass
                class LlamaConfig:
                    residual_multiplier: float = 1.0

                    @classmethod
                    def from_configs(cls, hf_config):
                        values = _config_values(hf_config)
                        return cls(**values)
            """,
            after='''
                def _read_config_keys(values: dict) -> None:
                    """The fields this port reads that config.json writes under other names."""
                    for name, key in {"embedding_multiplier": "scale_emb"}.items():
                        if values.get(name) is None and values.get(key) is not None:
                            values[name] = values[key]
                    if _unset(values, "residual_multiplier", "num_hidden_layers", "scale_depth"):
                        values["residual_multiplier"] = values["scale_depth"] / values["num_hidden_layers"] ** 0.5


                def _unset(values: dict, name: str, *keys: str) -> bool:
                    """``name`` is unset and every key it is computed from is set."""
                    return values.get(name) is None and all(values.get(key) is not None for key in keys)


                @dataclass
                class LlamaConfig:
                    residual_multiplier: float = 1.0

                    @classmethod
                    def from_configs(cls, hf_config):
                        values = _config_values(hf_config)
                        # <-- MODEL-SPECIFIC: config.json names these fields otherwise
                        _read_config_keys(values)
                        return cls(**values)
            ''',
        ),
        Example(
            title="no from_configs",
            role="config",
            path="config.py",
            params={"keys": {"hidden_size": "n_embd"}},
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
            """,
            raises="LlamaConfig has no from_configs",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> ConfigKeyAliasesParams:
        return ConfigKeyAliasesParams(keys=dict(target.checkpoint.config_keys or {}))

    @classmethod
    def check_params(cls, params: ConfigKeyAliasesParams) -> list[str]:
        return [
            f"keys[{name!r}]: {source!r} is not a config.json key, '<key> or <expression>' nor an "
            "arithmetic expression of keys and numbers"
            for name, source in params.keys.items()
            if _parsed(source) is None
        ]

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        cls = config_class(module, ctx)
        method = method_of(cls, "from_configs")
        if method is None:
            raise ctx.refuse(
                f"{cls.name.value} has no from_configs to read config.json's keys in", cls, module
            )
        if not _calls_reader(method):
            found = config_values(method)
            if found is None:
                raise ctx.refuse(
                    f"{cls.name.value}.from_configs binds no local to the model config's values "
                    f"({CONVENTIONAL!r}, or a name assigned <config>.to_dict() or dict(<config>))",
                    method,
                    module,
                )
            if found.statement is None:
                raise ctx.refuse(
                    f"{cls.name.value}.from_configs binds {found.name!r} on some paths only: "
                    "the keys would be read from it unbound",
                    found.partial or method,
                    module,
                )
            call = with_comment(parse_statement(f"{FUNCTION}({found.name})", module), COMMENT)
            module = insert_after(module, found.statement, [call])  # type: ignore[assignment]
        return add_functions(module, _functions(self.params.keys), replace=True)


def _calls_reader(method: cst.FunctionDef) -> bool:
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == FUNCTION
        for n in walk(method)
    )


def _parsed(source: str) -> tuple[str | None, cst.BaseExpression | None] | None:
    """``(key, expression)`` of a source: a key, ``<key> or <expression>`` or
    an expression; None when it is none of these."""
    try:
        node = cst.parse_expression(source)
    except cst.ParserSyntaxError:
        return None
    if isinstance(node, cst.Name):
        return node.value, None
    key = None
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        if not isinstance(node.left, cst.Name):
            return None
        key, node = node.left.value, node.right
    allowed = all(
        isinstance(n, (cst.Name, cst.Integer, cst.Float, cst.LeftParen, cst.RightParen, *_OPERATORS))
        or (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, _OPERATORS))
        for n in walk(node)
        if isinstance(n, (cst.BaseExpression, cst.BaseBinaryOp, cst.LeftParen, cst.RightParen))
    )
    return (key, node) if allowed and not isinstance(node, cst.Name) else None


UNSET = '''
def _unset(values: dict, name: str, *keys: str) -> bool:
    """``name`` is unset and every key it is computed from is set."""
    return values.get(name) is None and all(values.get(key) is not None for key in keys)
'''


class _ReadValues(cst.CSTTransformer):
    """Each config key of an expression read from ``values``."""

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return cst.parse_expression(f'values["{updated.value}"]')


def _functions(keys: dict[str, str]) -> list[str]:
    aliases, computed = {}, []
    for name, source in keys.items():
        parsed = _parsed(source)
        assert parsed is not None, source
        key, expression = parsed
        if key is not None:
            aliases[name] = key
        if expression is not None:
            needed = sorted({n.value for n in walk(expression) if isinstance(n, cst.Name)})
            code = cst.Module([]).code_for_node(expression.visit(_ReadValues()))
            given = ", ".join(f'"{k}"' for k in [name, *needed])
            computed.append(f'    if _unset(values, {given}):\n        values["{name}"] = {code}\n')
    table = "{" + ", ".join(f'"{k}": "{v}"' for k, v in aliases.items()) + "}"
    loop = (
        f"    for name, key in {table}.items():\n"
        "        if values.get(name) is None and values.get(key) is not None:\n"
        "            values[name] = values[key]\n"
        if aliases
        else ""
    )
    body = (
        f"def {FUNCTION}(values: dict) -> None:\n"
        '    """The fields this port reads that config.json writes under other names."""\n'
        + loop
        + "".join(computed)
    )
    return [body, UNSET] if computed else [body]
