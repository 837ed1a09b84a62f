"""`sidecar-ops verify`: prove an all-in-one sidecar is complete, aligned and sane. Pure pyarrow.

Cheap checks cover every shard from one listing per prefix plus the base and output footers.
Deep checks re-read N sampled shards (seeded) from base, output and every source, value for value, a window
of rows at a time, each object opened once.
Score statistics cover the sampled shards, or every output shard with `all_shards`.

  registry.py  the check registry (report order, units, the JSON schema's names)
  checks.py    the registered checks
  footers.py   footer facts of every shard; values.py  data checks of one shard (check_shard)
  compare.py   value-for-value comparison;    driver.py  verify() itself
"""
from tasks.verification.checks import (
                                 BASE,
                                 INPUTS,
                                 KEYS,
                                 MERGED,
                                 NO_NAN,
                                 PROVENANCE,
                                 ROWS,
                                 SCHEMA,
                                 SHARD_SET,
                                 STRAYS,
                                 siblings_check,
)
from tasks.verification.compare import compare
from tasks.verification.driver import Halted, Report, choose_sample, verify
from tasks.verification.registry import REGISTRY, Check, Failure
from tasks.verification.values import Runner, ShardResult, ShardTask, check_locally, check_shard

__all__ = ["BASE", "Halted", "INPUTS", "KEYS", "MERGED", "NO_NAN", "PROVENANCE", "REGISTRY", "ROWS", "SCHEMA", "SHARD_SET", "STRAYS",
           "Check", "Failure", "Report", "Runner", "ShardResult", "ShardTask", "check_locally", "check_shard",
           "choose_sample", "compare", "siblings_check", "verify"]
