"""A run's configuration, built once and passed down: the pipeline, where it is written, how it runs.

The command line builds it from its arguments (bad input stops before any flow run starts); a flow run
builds the same object from its parameters, so a deployment run, a UI "Custom run" and a CLI run with the
same values behave alike. Nothing below reads the environment for these choices.
"""
from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from flows.interrupt import DEFAULT_GRACE
from tasks.config import Pipeline, check_output_prefix, load_pipeline
from tasks.errors import ConfigError
from tasks import storage

DEFAULT_MAX_INFLIGHT = 32        # merge: shard chains in flight at once
DEFAULT_VERIFY_INFLIGHT = 8      # verify: each deep check holds a base, an output and a source table
DEFAULT_SAMPLES = 50             # verify: shards compared value by value
DEFAULT_RETRIES = 1
MAX_WINDOW_MIB = 65536           # a window is one row group of the output: 64 GiB is past any sane budget


@dataclass(frozen=True)
class RunnerChoice:
    """Where shard tasks run: Prefect's thread pool, or Ray (a local instance, or a cluster's address)."""

    use_ray: bool = False
    ray_address: str | None = None
    task_cpus: float | None = None
    task_memory_gb: float | None = None
    max_workers: int | None = None   # thread pool size (None: Prefect's default)
    debug: bool = False              # Ray logs reach the driver

    @property
    def joins_cluster(self) -> bool:
        return self.use_ray and self.ray_address not in (None, "local")


@dataclass(frozen=True)
class RunConfig:
    pipeline: Pipeline
    output_prefix: str
    pipeline_file: str               # absolute path of the pipeline YAML (what a flow run records)
    datasets_dir: str | None = None
    new_output: bool = False         # no output prefix was given: a new timestamped one was chosen
    runner: RunnerChoice = field(default_factory=RunnerChoice)
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    # merge
    overwrite: bool = False          # recompute every shard (else resume: keep complete outputs)
    overwrite_before: str | None = None  # recompute shards written by runs started before this (UTC ISO time)
    continue_overwrite: str | None = None  # continue the interrupted overwrite of this id (its first run's id)
    fail_fast: bool = False
    grace_seconds: float = DEFAULT_GRACE  # after a first SIGINT/SIGTERM, for shards in flight
    retries: int = DEFAULT_RETRIES
    fuse_operations: bool = True     # one task per shard (streamed); False: a chain of one task per operation
    window_mib: float | None = None  # a shard task's window budget in MiB (None: tasks.windows.WINDOW_BYTES)
    recompress: str | None = None    # "zstd": every column decoded and encoded again; None: chunks copied
    # verify
    samples: int = DEFAULT_SAMPLES
    all_shards: bool = False
    seed: int = 0

    @classmethod
    def load(cls, pipeline_file: str, output_prefix: str | None, datasets_dir: str | None = None, *,
             writes: bool = False, **options) -> RunConfig:
        """The one constructor: the pipeline loaded and validated, a normalized output prefix apart from every
        input, sane limits. A run that `writes` (a merge) needs a backend that writes atomically there, and
        without an output prefix gets a new timestamped sibling of the dataset's sidecar_prefix."""
        pipeline = load_pipeline(pipeline_file, datasets_dir)
        new_output = not output_prefix and writes
        output = default_output(pipeline) if new_output else checked_output(output_prefix)
        check_output_prefix(pipeline, output)
        if writes:
            try:
                storage.check_writable(output)
            except ValueError as exc:
                raise ConfigError(f"--output-prefix: {exc}") from None
        config = cls(pipeline, output, os.path.abspath(pipeline_file), datasets_dir, new_output, **options)
        if config.overwrite_before is not None and config.continue_overwrite is not None:
            raise ConfigError("--continue-overwrite and --overwrite-before: give one of them")
        if config.overwrite_before is not None:
            config = replace(config, overwrite=True, overwrite_before=utc_time(config.overwrite_before))
        if config.continue_overwrite is not None:
            config = replace(config, overwrite=True, continue_overwrite=overwrite_id(config.continue_overwrite))
        for name, least in (("max_inflight", 1), ("retries", 0), ("samples", 0), ("grace_seconds", 0)):
            if getattr(config, name) < least:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be {least} or more, got {getattr(config, name)}")
        mib = config.window_mib
        if mib is not None and not (isinstance(mib, (int, float)) and math.isfinite(mib) and 1 <= mib <= MAX_WINDOW_MIB):
            raise ConfigError(f"--window-mib must be a number of MiB from 1 to {MAX_WINDOW_MIB}, got {mib}")
        if config.recompress not in (None, "", "zstd"):
            raise ConfigError(f"--recompress must be zstd (or omitted: chunks copied), got {config.recompress!r}")
        return config

    @property
    def window_bytes(self) -> dict[str, int]:
        """The Job field of the window budget (none: the kernel's default)."""
        return {} if self.window_mib is None else {"window_bytes": int(self.window_mib * 2**20)}

    def flow_parameters(self, *names: str) -> dict:
        """The flow run parameters that rebuild this config (the ones a deployment passes)."""
        r = self.runner
        values = {"pipeline": self.pipeline_file, "output_prefix": self.output_prefix,
                  "datasets_dir": self.datasets_dir, "use_ray": r.use_ray, "ray_address": r.ray_address,
                  "task_cpus": r.task_cpus, "task_memory_gb": r.task_memory_gb, "max_inflight": self.max_inflight,
                  "debug": r.debug, "overwrite": self.overwrite, "overwrite_before": self.overwrite_before,
                  "continue_overwrite": self.continue_overwrite,
                  "fail_fast": self.fail_fast, "grace_seconds": self.grace_seconds,
                  "retries": self.retries, "fuse_operations": self.fuse_operations, "samples": self.samples,
                  "all_shards": self.all_shards, "seed": self.seed, "window_mib": self.window_mib,
                  "recompress": self.recompress}
        return {name: values[name] for name in names}


def checked_output(prefix: str | None) -> str:
    """The normalized output prefix; only verify can lack one (a merge without one gets a new prefix)."""
    if not prefix:
        raise ConfigError("verify needs --output-prefix: the all-in-one sidecar to check")
    try:
        return storage.normalize_prefix(prefix)
    except ValueError as exc:
        raise ConfigError(f"--output-prefix: {exc}") from None


def default_output(pipeline: Pipeline) -> str:
    """A new timestamped sibling of the dataset's sidecar_prefix (a run without --output-prefix)."""
    stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
    return pipeline.dataset.sidecar_prefix.rstrip("/") + f"_run_{stamp}/"


def utc_time(text: str) -> str:
    """An ISO 8601 time (a zone, or UTC when it has none) in the one form provenance records:
    2026-12-04T05:01:02.123456+00:00."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--overwrite-before: {text!r} is not an ISO 8601 time (e.g. 2026-12-04T05:01:02Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat(timespec="microseconds")


def overwrite_id(text: str) -> str:
    """The id of an overwrite to continue: the UUID an interrupted --overwrite's summary prints."""
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise ConfigError(f"--continue-overwrite: {text!r} is not an overwrite id (the UUID an interrupted "
                          "--overwrite's summary prints)") from None
