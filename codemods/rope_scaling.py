"""rope-scaling: a RoPE frequency variant (linear, dynamic NTK, YaRN, LongRoPE)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    code_of,
    dotted,
    has_comment,
    method,
    self_assignment,
    self_attr,
    statements,
    string_text,
    walk,
)
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import parse_method
from autoport_cst.transform.edit.imports import ensure_import
from autoport_cst.transform.edit.rope_variant_code import (
    COMMON_INIT,
    COMPUTE_BRANCH,
    FACTOR_READERS,
    FORWARD_BRANCH,
    FORWARD_METHOD,
    SCALED,
    SETUP,
)
from autoport_cst.transform.edit.tree import Edit, followed_by, preceded_by, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, to

ID = "rope-scaling"

Variant = Literal["linear", "dynamic", "yarn", "longrope", "none"]


@dataclass(frozen=True)
class RopeScalingParams:
    variant: Variant = field(
        default="yarn",
        metadata={"doc": "RoPE type added to those the rotary embedding accepts (rope_type in the config)."},
    )


class RopeScaling(Codemod):
    """Teach the rotary embedding a RoPE frequency variant: linear, dynamic NTK, YaRN, LongRoPE, or none.

    The variant is chosen at run time by the config's ``rope_type`` (except
    ``none``), with the semantics of transformers' ``ROPE_INIT_FUNCTIONS``:

    - ``linear``: every inverse frequency divided by ``factor``;
    - ``dynamic`` (NTK): once the sequence (the step's last position + 1)
      exceeds ``max_position_embeddings``, the base becomes
      ``theta * (factor * L / max - (factor - 1)) ** (d / (d - 2))``; computed
      on tensors in ``forward`` (no ``.item()``). Like transformers, each step
      uses its own length: a prefill of T tokens and a later decode step rotate
      with different bases past the limit;
    - ``yarn``: the frequencies between the beta_fast and beta_slow
      correction dimensions blend interpolated (``/ factor``) and original
      values; cos and sin are multiplied by the attention factor (default
      ``0.1 ln(factor) + 1``, or the mscale ratio);
    - ``longrope``: frequencies divided by the short factors, or by the long
      factors past ``original_max_position_embeddings``; cos and sin times
      the attention factor (default ``sqrt(1 + ln(factor) / ln(original))``);
    - ``none``: no positional embedding on any layer, whatever the config's
      ``rope_type``: every frequency is zero, so cos = 1 and sin = 0 and both
      attention paths rotate by angle zero (q and k unchanged, bit for bit).

    Model file, rotary class (``<Prefix>RotaryEmbedding``): the variant joins
    the ``rope_type`` guard tuple; ``__init__`` gains the Python scalars the
    variant needs (``max_position_embeddings``, ``attention_scaling``, and a
    ``_setup_<variant>`` method for YaRN and LongRoPE) while every tensor is
    still built in ``forward`` (lazy rule); ``_compute_inv_freq`` gains the
    static variants' branch, ``forward`` the length-dependent ones'; cos and
    sin are scaled by ``self.attention_scaling``. Config file: the dataclass
    gains ``original_max_position_embeddings`` (Phi-3 keeps it outside the
    RoPE parameters).

    The rotary class may keep the RoPE type as ``self.rope_type`` or in a
    local read from the RoPE parameters (``rope_type =
    self.rope_parameters.get("rope_type")``, transformers v5's
    ``config.rope_parameters``, as the real vllm_neuron llama3 does): the type
    is then also kept as ``self.rope_type`` for the variant's branches, and
    ``self.scaling_factor`` set unconditionally when the variant reads it.

    Preconditions: one rotary class whose ``__init__`` reads the RoPE
    parameters (into a local, or an attribute holding the config's) and
    refuses other types with ``if <rope type> not in (...)`` (an ``if`` or an
    ``elif``), with ``_compute_inv_freq(self, device)`` ending in ``return
    inv_freq``, and a ``forward`` computing ``inv_freq =
    self._compute_inv_freq(...)`` and returning ``emb.cos()`` / ``emb.sin()``.
    """

    ID = ID
    REALIZES = Realizes({"rope.type": to("linear", "dynamic", "yarn", "longrope", "none")})
    Params = RopeScalingParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            130,
            lambda spec, facts: spec.rope.type == "none",
            "no rotary embedding: the model's position handling must be ported by hand",
        ),
        Pitfall(
            131,
            lambda spec, facts: spec.rope.type not in ("default", "none"),
            lambda spec, facts: (
                f"RoPE type {spec.rope.type}: compute inv_freq lazily (never in __init__) and read theta and "
                f"scaling from config.{facts.value('config.rope_form', 'rope_parameters')}"
            ),
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="YaRN",
            params={"variant": "yarn"},
            before="""
                import math


                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.head_dim = config.head_dim
                        self.rope_theta = float(config.rope_theta)
                        scaling = dict(config.rope_scaling or {})
                        self.rope_type = scaling.get("rope_type") or "default"
                        if self.rope_type not in ("default", "llama3"):
                            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
                        self.scaling_factor = float(scaling.get("factor", 1.0))

                    def _compute_inv_freq(self, device):
                        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
                        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))
                        return inv_freq

                    def forward(self, position_ids, device, dtype):
                        inv_freq = self._compute_inv_freq(device)
                        freqs = torch.outer(position_ids.to(torch.float32), inv_freq)
                        emb = torch.cat((freqs, freqs), dim=-1)
                        return emb.cos().to(dtype), emb.sin().to(dtype)
            """,
            after='''
                import math


                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.head_dim = config.head_dim
                        self.rope_theta = float(config.rope_theta)
                        scaling = dict(config.rope_scaling or {})
                        self.rope_type = scaling.get("rope_type") or "default"
                        if self.rope_type not in ("default", "llama3", "yarn"):
                            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
                        self.scaling_factor = float(scaling.get("factor", 1.0))
                        # <-- MODEL-SPECIFIC: scalars of the RoPE variants (tensors are built in forward)
                        self.max_position_embeddings = config.max_position_embeddings
                        self.attention_scaling = 1.0
                        if self.rope_type == "yarn":
                            self._setup_yarn(config, scaling)

                    def _setup_yarn(self, config, scaling):
                        """YaRN's frequency band and attention factor, as Python scalars: the
                        band (in rotated dimensions) between beta_fast and beta_slow rotations
                        over the original context blends interpolated and original frequencies."""
                        original = scaling.get("original_max_position_embeddings") or config.original_max_position_embeddings
                        factor = scaling.get("factor")
                        if factor is None:
                            factor = config.max_position_embeddings / original
                        self.scaling_factor = float(factor)

                        def mscale(scale, coefficient=1.0):
                            return 1.0 if scale <= 1 else 0.1 * coefficient * math.log(scale) + 1.0

                        attention_factor = scaling.get("attention_factor")
                        if attention_factor is None:
                            if scaling.get("mscale") and scaling.get("mscale_all_dim"):
                                attention_factor = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
                            else:
                                attention_factor = mscale(factor)
                        self.attention_scaling = float(attention_factor)

                        def correction_dim(rotations):
                            return (self.head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(self.rope_theta))

                        low = correction_dim(scaling.get("beta_fast") or 32)
                        high = correction_dim(scaling.get("beta_slow") or 1)
                        if scaling.get("truncate", True):
                            low, high = math.floor(low), math.ceil(high)
                        self.yarn_low = max(low, 0)
                        self.yarn_high = min(high, self.head_dim - 1)
                        if self.yarn_low == self.yarn_high:
                            self.yarn_high += 0.001

                    def _compute_inv_freq(self, device):
                        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
                        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))
                        if self.rope_type == "yarn":
                            ramp = (torch.arange(self.head_dim // 2, dtype=torch.float32, device=device) - self.yarn_low) / (
                                self.yarn_high - self.yarn_low
                            )
                            extrapolation = 1 - torch.clamp(ramp, 0, 1)
                            inv_freq = (inv_freq / self.scaling_factor) * (1 - extrapolation) + inv_freq * extrapolation
                        return inv_freq

                    def forward(self, position_ids, device, dtype):
                        inv_freq = self._compute_inv_freq(device)
                        freqs = torch.outer(position_ids.to(torch.float32), inv_freq)
                        emb = torch.cat((freqs, freqs), dim=-1)
                        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)
            ''',
        ),
        Example(
            title="dynamic NTK, computed from the step's positions",
            params={"variant": "dynamic"},
            before="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        scaling = dict(config.rope_scaling or {})
                        self.rope_type = scaling.get("rope_type") or "default"
                        if self.rope_type not in ("default",):
                            raise NotImplementedError(self.rope_type)

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
                        return inv_freq

                    def forward(self, positions, device, dtype):
                        inv_freq = self._compute_inv_freq(device)
                        emb = torch.outer(positions.float(), inv_freq).repeat(1, 2)
                        return emb.cos().to(dtype), emb.sin().to(dtype)
            """,
            after='''
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        scaling = dict(config.rope_scaling or {})
                        self.rope_type = scaling.get("rope_type") or "default"
                        if self.rope_type not in ("default", "dynamic"):
                            raise NotImplementedError(self.rope_type)
                        # <-- MODEL-SPECIFIC: scalars of the RoPE variants (tensors are built in forward)
                        self.max_position_embeddings = config.max_position_embeddings
                        self.attention_scaling = 1.0
                        self.scaling_factor = float(scaling.get("factor", 1.0))

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
                        return inv_freq

                    def _dynamic_ntk_inv_freq(self, inv_freq, position_ids):
                        """Dynamic NTK: beyond max_position_embeddings the base grows with the
                        sequence length (the step's last position + 1, kept as a tensor)."""
                        seq_len = position_ids.max().to(torch.float32) + 1
                        limit = float(self.max_position_embeddings)
                        factor = self.scaling_factor
                        base = self.rope_theta * (
                            (factor * torch.clamp(seq_len, min=limit) / limit) - (factor - 1)
                        ) ** (self.head_dim / (self.head_dim - 2))
                        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=inv_freq.device)
                        scaled = 1.0 / (base ** (exponents.to(torch.float32) / self.head_dim))
                        return torch.where(seq_len > limit, scaled, inv_freq)

                    def forward(self, positions, device, dtype):
                        inv_freq = self._compute_inv_freq(device)
                        if self.rope_type == "dynamic":
                            inv_freq = self._dynamic_ntk_inv_freq(inv_freq, positions)
                        emb = torch.outer(positions.float(), inv_freq).repeat(1, 2)
                        return emb.cos().to(dtype), emb.sin().to(dtype)
            ''',
        ),
        Example(
            title="a guard of its own shape: the type in a local, elif, the config's rope_parameters (real vllm_neuron llama3)",
            params={"variant": "linear"},
            before="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.rope_theta = config.rope_parameters["rope_theta"]
                        self.head_dim = config.head_dim
                        self.rope_parameters = config.rope_parameters
                        rope_type = self.rope_parameters.get("rope_type")
                        if rope_type == "llama3":
                            self.scaling_factor = self.rope_parameters.get("factor", 1.0)
                        elif rope_type not in (None, "default"):
                            raise NotImplementedError(f"rope_type '{rope_type}' is not supported")

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
                        if self.rope_parameters.get("rope_type") == "llama3":
                            inv_freq = self._apply_llama3_scaling(inv_freq)
                        return inv_freq

                    def forward(self, position_ids, device, dtype):
                        inv_freq = self._compute_inv_freq(device)
                        emb = torch.outer(position_ids.float(), inv_freq).repeat(1, 2)
                        return emb.cos().to(dtype=dtype), emb.sin().to(dtype=dtype)
            """,
            after="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.rope_theta = config.rope_parameters["rope_theta"]
                        self.head_dim = config.head_dim
                        self.rope_parameters = config.rope_parameters
                        rope_type = self.rope_parameters.get("rope_type")
                        if rope_type == "llama3":
                            self.scaling_factor = self.rope_parameters.get("factor", 1.0)
                        elif rope_type not in (None, "default", "linear"):
                            raise NotImplementedError(f"rope_type '{rope_type}' is not supported")
                        # <-- MODEL-SPECIFIC: scalars of the RoPE variants (tensors are built in forward)
                        self.rope_type = rope_type
                        self.max_position_embeddings = config.max_position_embeddings
                        self.attention_scaling = 1.0
                        self.scaling_factor = float(self.rope_parameters.get("factor", 1.0))

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
                        if self.rope_parameters.get("rope_type") == "llama3":
                            inv_freq = self._apply_llama3_scaling(inv_freq)
                        if self.rope_type == "linear":
                            inv_freq = inv_freq / self.scaling_factor
                        return inv_freq

                    def forward(self, position_ids, device, dtype):
                        inv_freq = self._compute_inv_freq(device)
                        emb = torch.outer(position_ids.float(), inv_freq).repeat(1, 2)
                        return emb.cos().to(dtype=dtype), emb.sin().to(dtype=dtype)
            """,
        ),
        Example(
            title="no positional embedding on any layer",
            params={"variant": "none"},
            before="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        scaling = dict(config.rope_scaling or {})
                        self.rope_type = scaling.get("rope_type") or "default"
                        if self.rope_type not in ("default",):
                            raise NotImplementedError(self.rope_type)

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
                        return inv_freq
            """,
            after="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        scaling = dict(config.rope_scaling or {})
                        self.rope_type = scaling.get("rope_type") or "default"
                        if self.rope_type not in ("default",):
                            raise NotImplementedError(self.rope_type)

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
                        # <-- MODEL-SPECIFIC: no positional embedding: zero frequencies, cos = 1 and sin = 0
                        inv_freq = torch.zeros_like(inv_freq)
                        return inv_freq
            """,
        ),
        Example(
            title="no positional embedding, frequencies returned as computed (the real vllm_neuron qwen3)",
            params={"variant": "none"},
            before="""
                class Qwen3RotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.rope_theta = config.rope_theta

                    def _compute_inv_freq(self, device):
                        return 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
            """,
            after="""
                class Qwen3RotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.rope_theta = config.rope_theta

                    def _compute_inv_freq(self, device):
                        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
                        # <-- MODEL-SPECIFIC: no positional embedding: zero frequencies, cos = 1 and sin = 0
                        inv_freq = torch.zeros_like(inv_freq)
                        return inv_freq
            """,
        ),
        Example(
            title="the config field",
            role="config",
            path="config.py",
            params={"variant": "longrope"},
            before="""
                @dataclass
                class LlamaConfig:
                    max_position_embeddings: int = 131072
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    max_position_embeddings: int = 131072
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # pretraining context of YaRN / LongRoPE when not in rope_scaling
                    original_max_position_embeddings: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="a rotary embedding without a rope_type guard",
            params={"variant": "linear"},
            before="""
                class LlamaRotaryEmbedding(nn.Module):
                    def __init__(self, config):
                        self.inv_freq = None

                    def _compute_inv_freq(self, device):
                        return inv_freq

                    def forward(self, x):
                        return x
            """,
            raises="rope-scaling: LlamaRotaryEmbedding.__init__ has no `if <rope type> not in (...)` guard",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> RopeScalingParams:
        return RopeScalingParams(variant=target.rope.type)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            return self._config(module, ctx)
        rotary = classes_with_role(module, "rotary")
        if not rotary and any(class_role(name) == "rotary" for name in ctx.port.package_classes):
            return module  # the rotary embedding is defined in another file of the package
        if len(rotary) != 1:
            raise ctx.precondition(
                f"{ID}: expected one rotary embedding class (<Prefix>RotaryEmbedding), found {len(rotary)}"
            )
        return self._rotary(rotary[0], module, ctx)

    def _config(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if self.params.variant not in SCALED:
            return module
        return add_config_fields(
            module,
            ctx,
            [
                (
                    "original_max_position_embeddings: int | None = None",
                    "pretraining context of YaRN / LongRoPE when not in rope_scaling",
                )
            ],
        )

    def _rotary(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext) -> cst.Module:
        """The rotary class taught the variant: its guard, ``__init__``'s
        scalars, the setup method, the compute and forward branches and the
        attention factor on cos and sin (all gathered, then one rewrite)."""
        variant = self.params.variant
        name = cls.name.value
        init = method(cls, "__init__")
        compute = method(cls, "_compute_inv_freq")
        forward = method(cls, "forward")
        if variant == "none" and compute is not None:
            return self._no_rope(cls, compute, module, ctx)
        if init is None or compute is None or forward is None:
            raise ctx.precondition(
                f"{ID}: {name} needs __init__, _compute_inv_freq and forward (lazy RoPE; run lazy-rope first)",
                cls,
                module,
            )
        guard = _guard(init)
        if guard is None:
            raise ctx.precondition(
                f"{ID}: {name}.__init__ has no `if <rope type> not in (...)` guard refusing the RoPE types it "
                "does not implement",
                init,
                module,
            )
        _, guard_tuple, rope_type = guard
        if variant in [string_text(e.value) for e in guard_tuple.elements]:
            return module
        edits: dict[int, Edit] = {id(guard_tuple): _accepting(guard_tuple, variant, module)}
        edits.update(self._init_edits(name, init, rope_type, module, ctx))
        if variant in SETUP:
            placed = parse_method(SETUP[variant], module).with_changes(
                leading_lines=[cst.EmptyLine(indent=False)]
            )
            edits[id(init)] = followed_by(placed)
        if variant in COMPUTE_BRANCH:
            edits.update(self._compute_edits(name, compute, module, ctx))
        if variant in FORWARD_BRANCH:
            edits.update(self._forward_edits(name, compute, forward, module, ctx))
        if variant in SCALED:
            edits.update(_attention_scaling_edits(name, forward, module, ctx))
        module = rewrite(module, edits)
        return ensure_import(module, "math") if variant in SETUP else module

    def _init_edits(
        self, name: str, init: cst.FunctionDef, rope_type: str, module: cst.Module, ctx: FileContext
    ) -> dict[int, Edit]:
        """``__init__``'s new scalars, after its last statement (the guard and
        the statements that follow it)."""
        variant = self.params.variant
        config = init.params.params[1].name.value if len(init.params.params) > 1 else "config"
        scaling_local = _scaling_local(init)
        init_body = list(statements(init))
        existing = {pair[0] for s in init_body if (pair := self_assignment(s)) is not None}
        new_init: list[cst.BaseStatement] = []
        if "rope_type" not in existing:
            # the branches below read the type as self.rope_type
            new_init.append(parse_statement(f"self.rope_type = {rope_type}", module))
        for attr, code in COMMON_INIT.items():
            if attr not in existing:
                new_init.append(parse_statement(code.format(config=config), module))
        if variant in FACTOR_READERS and "scaling_factor" not in existing:
            if scaling_local is None:
                raise ctx.precondition(
                    f"{ID}: {name}.__init__ reads no RoPE parameters dict (config.rope_parameters or "
                    "config.rope_scaling) to take the scaling factor from",
                    init,
                    module,
                )
            new_init.append(
                parse_statement(f'self.scaling_factor = float({scaling_local}.get("factor", 1.0))', module)
            )
        if variant in SETUP:
            if scaling_local is None:
                raise ctx.precondition(
                    f"{ID}: {name}.__init__ reads no RoPE parameters dict (scaling = dict(config.rope_scaling "
                    "or {}), or self.rope_parameters = config.rope_parameters)",
                    init,
                    module,
                )
            new_init += parse_statements(
                f'if self.rope_type == "{variant}":\n    self._setup_{variant}({config}, {scaling_local})\n',
                module,
            )
        if not new_init:
            return {}
        if not has_comment(init, "scalars of the RoPE variants"):
            new_init[0] = with_comment(
                new_init[0], "<-- MODEL-SPECIFIC: scalars of the RoPE variants (tensors are built in forward)"
            )
        return {id(init_body[-1]): followed_by(*new_init)}

    def _compute_edits(
        self, name: str, compute: cst.FunctionDef, module: cst.Module, ctx: FileContext
    ) -> dict[int, Edit]:
        """The static variant's branch, before ``_compute_inv_freq``'s ``return inv_freq``."""
        returns = [s for s in statements(compute) if _returns_name(s, "inv_freq")]
        if not returns:
            raise ctx.precondition(
                f"{ID}: {name}._compute_inv_freq must end with `return inv_freq`", compute, module
            )
        branch = parse_statements(COMPUTE_BRANCH[self.params.variant].strip("\n"), module)
        return {id(returns[-1]): preceded_by(*branch)}

    def _forward_edits(
        self,
        name: str,
        compute: cst.FunctionDef,
        forward: cst.FunctionDef,
        module: cst.Module,
        ctx: FileContext,
    ) -> dict[int, Edit]:
        """The length-dependent variant's branch after ``forward``'s
        ``inv_freq = self._compute_inv_freq(...)``, and its method after
        ``_compute_inv_freq``."""
        variant = self.params.variant
        params = [p.name.value for p in forward.params.params]
        positions = params[1] if len(params) > 1 else None
        holder = next((s for s in statements(forward) if _computes_inv_freq(s)), None)
        if holder is None or positions is None:
            raise ctx.precondition(
                f"{ID}: {name}.forward must compute `inv_freq = self._compute_inv_freq(...)` "
                "from its position ids",
                forward,
                module,
            )
        branch = parse_statements(FORWARD_BRANCH[variant].format(positions=positions).strip("\n"), module)
        method_stmt = parse_method(FORWARD_METHOD[variant], module).with_changes(
            leading_lines=[cst.EmptyLine(indent=False)]
        )
        return {id(holder): followed_by(*branch), id(compute): followed_by(method_stmt)}

    def _no_rope(self, cls, compute, module, ctx) -> cst.Module:
        """Zero frequencies before ``_compute_inv_freq``'s ``return
        inv_freq``, or, where it returns the expression itself (the real
        vllm_neuron qwen3: ``return 1.0 / (...)``), that expression bound to
        ``inv_freq`` first."""
        body = list(statements(compute))
        returns = [s for s in body if _returns_name(s, "inv_freq")]
        last = body[-1] if body else None
        computed = (
            last.body[0].value
            if not returns
            and isinstance(last, cst.SimpleStatementLine)
            and isinstance(last.body[0], cst.Return)
            and last.body[0].value is not None
            else None
        )
        if not returns and computed is None:
            raise ctx.precondition(
                f"{ID}: {cls.name.value}._compute_inv_freq must end with `return inv_freq` or return the "
                "frequencies it computes",
                compute,
                module,
            )
        if has_comment(compute, "no positional embedding"):
            return module
        zero = with_comment(
            parse_statement("inv_freq = torch.zeros_like(inv_freq)", module),
            "<-- MODEL-SPECIFIC: no positional embedding: zero frequencies, cos = 1 and sin = 0",
        )
        if returns:
            return rewrite(module, {id(returns[-1]): lambda updated: cst.FlattenSentinel([zero, updated])})
        bound = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name("inv_freq"))], computed)])
        ending = parse_statement("return inv_freq", module)
        return rewrite(module, {id(last): lambda updated: cst.FlattenSentinel([bound, zero, ending])})


def _guard(init: cst.FunctionDef) -> tuple[cst.If, cst.Tuple, str] | None:
    """The ``if <rope type> not in (...)`` test (an ``if`` or an ``elif``
    among the top-level statements of ``__init__``) that refuses the RoPE
    types the class does not implement: the statement, the tuple of accepted
    types (strings and None) and the code of the rope-type expression
    (``self.rope_type``, or a local read from the RoPE parameters)."""
    for stmt in statements(init):
        branch = stmt
        while isinstance(branch, cst.If):
            found = _guard_test(branch.test)
            if found is not None:
                return (branch, *found)
            branch = branch.orelse
    return None


def _guard_test(test: cst.BaseExpression) -> tuple[cst.Tuple, str] | None:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    subject = dotted(test.left)
    target = test.comparisons[0]
    if subject is None or not (subject == "self.rope_type" or "." not in subject):
        return None
    if isinstance(target.operator, cst.NotIn) and isinstance(target.comparator, cst.Tuple):
        if all(
            string_text(e.value) is not None or dotted(e.value) == "None" for e in target.comparator.elements
        ):
            return target.comparator, subject
    return None


def _scaling_local(init: cst.FunctionDef) -> str | None:
    """The code of the RoPE parameters dict ``__init__`` reads: a local
    (``scaling = dict(config.rope_scaling or {})``) or an attribute holding
    the config's (``self.rope_parameters = config.rope_parameters``)."""
    for stmt in statements(init):
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
            small = stmt.body[0]
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and (isinstance(small.targets[0].target, cst.Name) or self_attr(small.targets[0].target))
                and any(
                    isinstance(n, cst.Attribute) and n.attr.value in ("rope_scaling", "rope_parameters")
                    for n in walk(small.value)
                )
                and not isinstance(small.value, cst.Subscript)
            ):
                return code_of(small.targets[0].target)
    return None


def _accepting(guard_tuple: cst.Tuple, variant: str, module: cst.Module) -> Edit:
    """The edit that makes the guard's tuple accept ``variant`` too."""
    new_tuple = parse_expr(
        "(" + ", ".join([*(code_of(e.value) for e in guard_tuple.elements), f'"{variant}"']) + ")", module
    )

    def accept(updated):
        return updated.with_changes(elements=new_tuple.elements, lpar=updated.lpar, rpar=updated.rpar)

    return accept


def _attention_scaling_edits(
    name: str, forward: cst.FunctionDef, module: cst.Module, ctx: FileContext
) -> dict[int, Edit]:
    """``forward``'s ``<emb>.cos()`` and ``<emb>.sin()`` scaled by the attention factor."""
    edits: dict[int, Edit] = {}
    for node in walk(forward):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("cos", "sin")
            and not node.args
        ):
            edits[id(node)] = lambda updated: parse_expr(
                f"({module.code_for_node(updated)} * self.attention_scaling)", module
            )
    if len(edits) != 2:
        raise ctx.precondition(
            f"{ID}: {name}.forward must compute cos and sin as <emb>.cos() and <emb>.sin()",
            forward,
            module,
        )
    return edits


def _computes_inv_freq(stmt: cst.BaseStatement) -> bool:
    """``inv_freq = ...self._compute_inv_freq(...)...``"""
    return _assigns(stmt, "inv_freq") and any(
        isinstance(n, cst.Call) and dotted(n.func) == "self._compute_inv_freq" for n in walk(stmt)
    )


def _returns_name(stmt: cst.BaseStatement, name: str) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Return)
        and isinstance(stmt.body[0].value, cst.Name)
        and stmt.body[0].value.value == name
    )


def _assigns(stmt: cst.BaseStatement, name: str) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Assign)
        and len(stmt.body[0].targets) == 1
        and isinstance(stmt.body[0].targets[0].target, cst.Name)
        and stmt.body[0].targets[0].target.value == name
    )
