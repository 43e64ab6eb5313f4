"""The interpreter's state: the source it reads, the configuration (every
read logged into the open capture frames), the call depth and the caches of
module globals and MROs; and the operations its parts call across modules,
defined by :class:`~autoport_cst.research.interp.interpreter.Interpreter`'s
parts (``classes``, ``expressions``, ``statements``, ``calls``)."""

from __future__ import annotations

import ast
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, TypeAlias

from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.values import UNKNOWN, Instance, SourceClass, State
from autoport_cst.research.sources import SourceLibrary, SourceModule

MAX_PATHS = 48
MAX_UNROLL = 512
MAX_DEPTH = 24

FunctionNode: TypeAlias = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class CallOptions:
    """How :meth:`Core.call_function` runs a function of the source."""

    owner: SourceClass | None = None  # the class that defines it (``super()`` inside it)
    inputs_symbolic: bool = False  # a parameter not given is a symbolic input, not its default
    record: Instance | None = None  # the instance it constructs: the arguments bound are recorded on it
    reads: dict | None = None  # and the config keys each argument read


PLAIN = CallOptions()


class Core(ABC):
    """The state of an interpreter and what its parts call across modules."""

    def __init__(self, library: SourceLibrary, config: Any) -> None:
        self.library = library
        self._log: list[set[str]] = []
        self.config = ConfigProxy(config, self._log)
        self.depth = 0
        self._globals: dict[tuple[int, str], Any] = {}
        self._mro: dict[Any, list] = {}
        # loops over a list of modules run for every item (what each layer is
        # passed), not only the first (what one layer computes)
        self.every_layer = False

    # ---- config-read capture -------------------------------------------------

    def capture(self) -> set[str]:
        frame: set[str] = set()
        self._log.append(frame)
        return frame

    def release(self, frame: set[str]) -> None:
        for index in range(len(self._log) - 1, -1, -1):
            if self._log[index] is frame:
                del self._log[index]
                return

    def note_read(self, name: str) -> None:
        """Log a read of the config field ``name`` (``hasattr(config, name)``)."""
        for frame in self._log:
            frame.add(name)

    # ---- what the parts call across modules ----------------------------------

    @abstractmethod
    def eval(self, expr: ast.expr | None, env: dict, module: SourceModule | None, state: State | None) -> Any:
        """The value of ``expr`` (``expressions``)."""

    @abstractmethod
    def getattr(self, base: Any, name: str, default: Any = UNKNOWN) -> Any:
        """``base.name`` (``expressions``)."""

    @abstractmethod
    def assign(
        self, target: ast.expr, value: Any, env: dict, module: SourceModule, state: State | None
    ) -> None:
        """Bind ``value`` to ``target`` (``statements``)."""

    @abstractmethod
    def iterate(self, value: Any) -> list | None:
        """The items a loop over ``value`` runs for; None when unknown (``statements``)."""

    @abstractmethod
    def call_function(
        self, module: SourceModule, fn: FunctionNode, args: list, kwargs: dict, how: CallOptions = PLAIN
    ) -> list[State]:
        """Run ``fn``: its end states, one per path (``calls``)."""
