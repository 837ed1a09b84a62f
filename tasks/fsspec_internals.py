"""The tasks layer's one door to other libraries' internals: s3fs and fsspec (flows/compat.py is the flows
layer's, for Prefect, prefect-ray, Ray and uvicorn; nothing under tasks/ may import flows/, and the storage
code runs in every Ray worker without Prefect's runner code).

Each entry is a small function that says what it does and why the public API does not suffice; each is
checked by tests/test_compat.py against the installed versions. When an internal is gone or has changed, the
entry raises CompatError naming the installed versions (at first use, never a silent fallback): pin the
versions of constraints.txt, or adapt the entry.
"""
from __future__ import annotations

CONSTRAINTS = "constraints.txt"


class CompatError(RuntimeError):
    """An internal of a library that sidecar-ops relies on is gone or has changed in the installed version."""


def installed(*dists: str) -> str:
    """'prefect 3.9.1, prefect-ray 0.6.0': the installed versions of these distributions."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in dists:
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    return ", ".join(found)


def broken(what: str, *dists: str, where: str = "tasks/fsspec_internals.py") -> CompatError:
    """The error for an internal `what` of `dists` that is gone or changed."""
    return CompatError(f"{what} is gone or has changed in the installed {installed(*dists)}; sidecar-ops relies "
                       f"on it ({where}): install the versions of {CONSTRAINTS} (`pip install -c {CONSTRAINTS} "
                       f"-e .`), or adapt {where} to this version")


# ---------------------------------------------------------------------------------------------------- s3fs

def pin_s3_file(opened, details: dict) -> None:
    """Make an open s3fs file (`S3File`) read only the version `details` (a HEAD reply) describes, as s3fs does
    itself for a file opened without a size: If-Match on every ranged GET (`S3File.read_kw`, the keyword
    arguments s3fs adds to each GetObject), or, where the store ignores If-Match
    (`S3FileSystem.local_expiry_check`), s3fs's own comparison of each reply's ETag with `details`.
    Public API: `details` (fsspec's setter) only; s3fs takes If-Match from the HEAD it makes in `open()` when no
    size is given, and offers no way to pin a file opened with a listed size (which spares that HEAD)."""
    if not hasattr(opened, "read_kw") or not hasattr(opened.fs, "local_expiry_check"):
        raise broken("s3fs's S3File.read_kw / S3FileSystem.local_expiry_check (the If-Match pin of a file's reads)",
                     "s3fs")
    opened.details = details
    if not opened.fs.local_expiry_check:
        opened.read_kw = {**(opened.read_kw or {}), "IfMatch": details["ETag"]}


# -------------------------------------------------------------------------------------------------- fsspec

def url_path(cls, uri: str) -> str:
    """fsspec's `AbstractFileSystem._strip_protocol`: the path an implementation class makes of a URL, without
    building a filesystem (public `fsspec.core.url_to_fs` instantiates it, which for ftp/sftp/http connects)."""
    strip = getattr(cls, "_strip_protocol", None)
    if not callable(strip):
        raise broken(f"fsspec's {cls.__name__}._strip_protocol", "fsspec")
    return strip(uri)


def url_options(cls, uri: str) -> dict:
    """fsspec's `AbstractFileSystem._get_kwargs_from_urls`: the constructor options an implementation reads
    from a URL itself (a host, a port, a user: non-empty means the URL names a location, not just a path).
    No public equivalent that does not build the filesystem."""
    options = getattr(cls, "_get_kwargs_from_urls", None)
    if not callable(options):
        raise broken(f"fsspec's {cls.__name__}._get_kwargs_from_urls", "fsspec")
    return options(uri)
