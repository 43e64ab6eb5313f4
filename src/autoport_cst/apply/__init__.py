"""The apply engine: reference packages, composition, transformation, atomic writes."""

from autoport_cst.apply.composer import Composition, Step, compose
from autoport_cst.apply.engine import PortResult, StepResult, build_port
from autoport_cst.apply.reference import Reference, load_reference
from autoport_cst.apply.writer import WriteReport, differences, write_port

__all__ = [
    "Composition",
    "PortResult",
    "Reference",
    "Step",
    "StepResult",
    "WriteReport",
    "build_port",
    "compose",
    "differences",
    "load_reference",
    "write_port",
]
