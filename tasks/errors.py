"""The two kinds of failure users see, each rendered as one line."""
import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_line(exc: BaseException | None) -> str:
    """The first line of an error; for a Ray task error, of its cause (Ray's own header says little). A header
    ending in a colon over a remote traceback (Ray Client's "Initialization failure from server:") gets the
    traceback's last line, which says what failed."""
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError wraps the task's exception
    if isinstance(cause, BaseException):
        exc = cause
    text = ANSI.sub("", str(exc) if exc is not None else "unknown failure").strip()
    if not text:
        return type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines[0].endswith(":") and len(lines) > 1:  # a header over a remote traceback: its last line says what
        return f"{lines[0]} {lines[-1]}"
    return lines[0]


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
