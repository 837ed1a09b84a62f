"""The two kinds of failure users see, each rendered as one line."""


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
