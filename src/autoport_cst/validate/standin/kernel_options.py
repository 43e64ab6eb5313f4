"""What a stand-in kernel does with the keyword arguments it does not model.

A real ``vllm_neuron.functional`` kernel takes many keyword arguments. The
stand-in implements the ones that change the result; the rest fall in two
groups, declared per kernel as data (``KernelOptions``):

- ``hints``: arguments that only steer how the device computes (SBUF
  allocation, DMA transposes, sharding grids). Any value is accepted: the
  result is the same.
- ``refused``: arguments whose non-default values the stand-in does not
  implement (transposed layouts, outputs kept in SBUF, quantized weights...).
  The default is accepted; any other value is refused with an error that
  names the argument and the value.

A name in neither group is not an argument of the kernel at all and is
refused as such; a bool given for one of a kernel's integer parameters
(``refuse_bools``) is refused by name too. Defaults compare by identity for ``None``/``True``/``False``,
by value for numbers (a bool is never taken for a number) and by type and
value otherwise, so ``True`` never passes for a default of ``1`` (nor ``1``
for ``False``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class KernelArgumentError(TypeError):
    """A keyword argument the kernel does not have."""


class UnsupportedKernelOption(NotImplementedError):
    """A kernel argument value the CPU stand-in does not implement."""


@dataclass(frozen=True)
class KernelOptions:
    """The unmodelled keyword arguments of one kernel."""

    op: str
    refused: dict[str, Any] = field(default_factory=dict)
    hints: frozenset[str] = frozenset()

    def check(self, options: dict[str, Any]) -> None:
        """Refuse unknown names and non-default values of refused options."""
        for name, value in options.items():
            if name in self.hints:
                continue
            if name not in self.refused:
                raise KernelArgumentError(
                    f"NF.{self.op}: unknown keyword argument '{name}' (not a parameter of the kernel)"
                )
            if not is_default(value, self.refused[name]):
                raise UnsupportedKernelOption(
                    f"NF.{self.op}: {name}={_show(value)} is not implemented in the CPU stand-in "
                    f"(only the default {_show(self.refused[name])})"
                )


def is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is the option's default: the same singleton for
    None/True/False, an equal number (never a bool) for a numeric default,
    the same type and value otherwise (enum members)."""
    if default is None or isinstance(default, bool):
        return value is default
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == default
    return type(value) is type(default) and value == default


def refuse_unless_default(op: str, **given: tuple[Any, Any]) -> None:
    """``given`` maps an explicit parameter to ``(value, default)``; refuse
    the first whose value is not its default."""
    for name, (value, default) in given.items():
        if not is_default(value, default):
            raise UnsupportedKernelOption(
                f"NF.{op}: {name}={_show(value)} is not implemented in the CPU stand-in "
                f"(only the default {_show(default)})"
            )


def refuse_bools(op: str, **counts: Any) -> None:
    """``counts`` are a kernel's integer parameters: a bool is not taken for
    one (``True == 1``), it is refused by name."""
    for name, value in counts.items():
        if isinstance(value, bool):
            raise UnsupportedKernelOption(
                f"NF.{op}: {name}={value!r} is a bool where the kernel takes a number"
            )


def _show(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<tensor {list(value.shape)} {value.dtype}>"
    return repr(value)
