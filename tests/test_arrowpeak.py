"""arrow_peak's pools outlive what was allocated from them (tests/arrowpeak.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Buffers made inside arrow_peak, the pool's last name dropped, the freed memory reused, then the buffers freed:
# with a pool collected under them this dies of SIGSEGV within a few hundred rounds.
OUTLIVE = """
import pyarrow as pa
from arrowpeak import arrow_peak
for _ in range(2000):
    with arrow_peak() as pool:
        arr = pa.array(range(1000))
    del pool
    junk = [bytearray(64) for _ in range(200)]
    del arr
"""


@pytest.mark.slow
def test_a_buffer_that_outlives_its_peak_pool_is_freed_safely():
    run = subprocess.run([sys.executable, "-c", OUTLIVE], cwd=Path(__file__).parent, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
