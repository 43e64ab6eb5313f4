"""The failure of a port at a stage of a validation run, and whether an
error is the port's own refusal (a guard it raised) rather than a crash."""

from __future__ import annotations

from typing import Any


class PortFailure(Exception):
    """The port failed at a stage of the run (build, load, prefill, decode).
    The message says what and where; ``stage`` names the stage. ``refusal``:
    the port's own code raised NotImplementedError (a guard: something it
    declares unsupported), not a crash of the kernels or a wrong result;
    derived from the exception it was raised from unless given."""

    def __init__(self, stage: str, message: str, refusal: bool | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self._refusal = refusal

    @property
    def refusal(self) -> bool:
        if self._refusal is not None:
            return self._refusal
        return is_port_refusal(self.__cause__)


def is_port_refusal(error: BaseException | None) -> bool:
    """Whether ``error`` is a NotImplementedError raised by the port's own
    code: its innermost frame is neither this package (the stand-in's
    refusals of kernel options are its own) nor torch."""
    if not isinstance(error, NotImplementedError) or error.__traceback__ is None:
        return False
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and (is_port_code(frames[-1].filename) or _is_api_guard(frames[-1]))


def _is_api_guard(frame: Any) -> bool:
    """Whether a frame is a guard of the vllm_neuron API that models call to
    refuse what they do not support (``dtype_utils.validate_*``): it refuses
    on the port's behalf."""
    return frame.filename.endswith("dtype_utils.py") and frame.name.startswith("validate_")


def is_port_code(filename: str) -> bool:
    """Whether a frame's file is the port's own code (neither this package nor torch)."""
    return "autoport_cst" not in filename and "/torch/" not in filename
