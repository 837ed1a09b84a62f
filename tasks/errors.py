"""The two kinds of failure users see, each rendered as one line."""
import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_line(exc: BaseException | None) -> str:
    """The first line of an error; for a Ray task error, of its cause (Ray's own header says little)."""
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError wraps the task's exception
    if isinstance(cause, BaseException):
        exc = cause
    text = ANSI.sub("", str(exc) if exc is not None else "unknown failure").strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ConfigError(ValueError):
    """A bad configuration, argument or plan: nothing was written. Exit code 2."""


class ShardError(RuntimeError):
    """One shard could not be merged or verified; the message names the shard, the operation and the row.

    `transient` marks failures worth a retry (I/O, a vanished worker); alignment and schema errors are not.
    """

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient

    def __reduce__(self):  # keep `transient` across pickling (Ray workers, Prefect states)
        return (type(self), (str(self), self.transient))
