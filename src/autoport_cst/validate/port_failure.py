"""The failure of a port at a stage of a validation run, and whether an
error is the port's own refusal (a guard it raised) rather than a crash."""

from __future__ import annotations

from typing import Any


class PortFailure(Exception):
    """The port failed at a stage of the run (build, load, prefill, decode).
    The message says what and where; ``stage`` names the stage. ``refusal``:
    the port's own code raised NotImplementedError (a guard: something it
    declares unsupported), not a crash of the kernels or a wrong result.
    ``raised_in``: the function of the port's own code the error came from
    (its innermost frame there), or None. Both are derived from the exception
    it was raised from unless given (a failure passed on from a rank process
    or another graph keeps those of the first)."""

    def __init__(
        self, stage: str, message: str, refusal: bool | None = None, raised_in: str | None = None
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self._refusal = refusal
        self._raised_in = raised_in

    @property
    def refusal(self) -> bool:
        if self._refusal is not None:
            return self._refusal
        return is_port_refusal(self.__cause__)

    @property
    def raised_in(self) -> str | None:
        if self._raised_in is not None:
            return self._raised_in
        frame = port_frame(self.__cause__)
        return frame.name if frame is not None else None


def port_frame(error: BaseException | None) -> Any:
    """The innermost frame of the port's own code in ``error``'s traceback
    (a ``traceback.FrameSummary``), or None."""
    if error is None or error.__traceback__ is None:
        return None
    import traceback

    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if is_port_code(frame.filename):
            return frame
    return None


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
