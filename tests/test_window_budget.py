"""`--window-mib` (the flow's `window_mib`): the memory budget of a shard task reaches the kernel, sizes the
windows and so the output's row groups, and anything but a number of MiB from 1 to 65536 is one line, exit 2."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from core_fixtures import build, objects
from flows.runconfig import MAX_WINDOW_MIB, RunConfig
from tasks import storage
from tasks.errors import ConfigError

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

ROWS = 40_000  # a shard of ~10 MiB decoded: several windows of 1 MiB, one of the default budget


def row_groups(uri: str) -> list[int]:
    meta = storage.read_footer(uri)
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def one_row_group(uri: str) -> None:
    with storage.open_parquet(uri) as f:
        table = pq.ParquetFile(f).read()
    storage.write_atomic(table, uri, row_group_size=table.num_rows)


def test_the_budget_sizes_the_windows_and_so_the_output_row_groups(run, tmp_path):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=ROWS, watermark_gap=False)
    [rel] = [r for r in objects(setup.prefixes["base"]) if r.endswith(".parquet")]
    one_row_group(setup.prefixes["base"] + rel)  # what pyarrow's defaults write for a shard under 1Mi rows
    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--window-mib", "1", "--recompress", "zstd")
    assert code == 0, err
    small = row_groups(setup.output + rel)
    assert sum(small) == ROWS and len(small) > 2 and len(set(small[:-1])) == 1, small  # windows of one size
    with storage.open_parquet(setup.output + rel) as f:
        per_row = pq.ParquetFile(f).read().nbytes / ROWS
    assert small[0] * per_row <= 1.1 * 2**20, (small[0], per_row)  # a window within the budget

    code, out, err = run(setup.pipeline, "--output-prefix", setup.output, "--overwrite")
    assert code == 0, err
    assert row_groups(setup.output + rel) == [ROWS]  # the default budget holds the base's row group: kept


@pytest.mark.parametrize("value", ["0", "0.5", "nan", "inf", "-1", str(MAX_WINDOW_MIB + 1)])
def test_any_other_budget_is_one_line_exit_2_and_nothing_written(cli, prefect_api, tmp_path, value):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=10)
    code, out, err = cli("run", setup.pipeline, "--output-prefix", setup.output, "--window-mib", value)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--window-mib must be a number of MiB from 1 to 65536" in err
    assert not objects(setup.output)


@pytest.mark.parametrize("value", [1, 1.5, 64, MAX_WINDOW_MIB])
def test_a_budget_of_1_to_65536_mib_reaches_the_job(tmp_path, value):
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, rows=10)
    config = RunConfig.load(str(setup.pipeline), setup.output, window_mib=value)
    assert config.window_bytes == {"window_bytes": int(value * 2**20)}
    assert config.flow_parameters("window_mib") == {"window_mib": value}
    assert RunConfig.load(str(setup.pipeline), setup.output).window_bytes == {}
    with pytest.raises(ConfigError):
        RunConfig.load(str(setup.pipeline), setup.output, window_mib="64")


@pytest.mark.slow
@pytest.mark.parametrize("chosen, expected", [(None, "jemalloc"), ("system", "system")])
def test_arrow_allocates_from_jemalloc_in_our_processes_unless_the_user_chose(chosen, expected):
    """A flow run of a deployment imports flows.merge before anything imports pyarrow: Arrow's default pool (its
    C++ allocations too, which pyarrow's set_memory_pool cannot reach) is jemalloc, or the one the user set."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    code = "import flows.merge, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip() == expected
