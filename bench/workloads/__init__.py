"""Benchmark workloads W0-W5 for sidecar-ops; `python bench/run.py` runs them all."""
