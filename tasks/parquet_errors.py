"""Telling a parquet file pyarrow cannot parse from a storage failure (the two need different advice)."""
import pyarrow as pa


def unreadable_parquet(exc: BaseException) -> bool:
    """pyarrow could not parse the bytes (corrupt, truncated, not parquet), as opposed to an I/O failure.

    pyarrow reports parse failures as ArrowException or as a bare OSError without errno; storage errors
    arrive as OSError subclasses (FileNotFoundError, PermissionError, ConnectionError...) or carry an errno."""
    if isinstance(exc, pa.ArrowException):
        return True
    return type(exc) is OSError and exc.errno is None
