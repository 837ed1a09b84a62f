"""The task per operation's steps (tasks/kernel.py: read_base, apply_operation, write_output) driven one by one on
local disk: what each hands the next (the base's identity and keys as read, the history of the steps before) and
what write_output reports and stores."""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_streaming import REL, job_for, write

from tasks import kernel, storage
from tasks.coltypes import ColumnType
from tasks.config import Extension
from tasks.errors import ShardError
from tasks.kernel import (
    MERGE_SEMANTICS_VERSION,
    PROVENANCE_KEY,
    ShardStats,
    apply_operation,
    check_written,
    merge_shard,
    read_base,
    read_provenance,
    shard_key,
    write_output,
)
from tasks.ops.merge_from_sidecar import MergeFromSidecar
from tasks.ops.rename_columns import RenameColumns

pytestmark = pytest.mark.usefixtures("merge_path")  # every test on the copy and the decode path

KEYS = [f"k{i:02d}" for i in range(12)]
QUALITY = Extension("quality", ColumnType("quality_score", "floating"))
KEY_OF_V2 = "ffd43871209909aaaba87f27d5f5dc98820ec19dc7c6d657d1844dcb3b9870ad"  # merge semantics 2


def inputs(root: str) -> None:
    """A base of 12 rows (row groups of 5) and both siblings of test_streaming's pipeline, local or on S3."""
    storage.write_atomic(pa.table({"key": KEYS, "path": [f"p{k}" for k in KEYS], "image": [b"img"] * 12}),
                         f"{root}base/{REL}", row_group_size=5)
    storage.write_atomic(pa.table({"key": KEYS, "dqm": [float(i) for i in range(12)]}), f"{root}dqm/{REL}")
    storage.write_atomic(pa.table({"path": [f"p{k}" for k in KEYS], "aes": list(range(12))}), f"{root}aes/{REL}")


def chain(job, state):
    for index in range(len(job.pipeline.operations)):
        state = apply_operation(job, REL, index, state)
    return write_output(job, REL, state)


@pytest.mark.parametrize("streamed", [False, True], ids=["steps", "streamed"])
def test_the_steps_carry_the_base_as_read_and_write_output_reports_what_it_stored(tmp_path, monkeypatch, streamed,
                                                                                  merge_path):
    """The base is replaced (other keys, another size) right after the shard's first step opened it: the
    identity recorded is the file read (fstat, not a stat of the path), and the post-write check compares the
    written keys with the keys read (carried through every step, or reread from the same open file by the
    streamed merge; never the base opened again). The stats name the shard and the stored size; the key
    columns (the dataset's and the aes step's) are written plain, not dictionary encoded, by the decode path."""
    root = storage.normalize_prefix(str(tmp_path))
    inputs(root)
    job = replace(job_for(root, "out"), run_id="run-1", started="2026-12-05T09:00:00+00:00")
    base = job.base_uri(REL)
    read_identity = storage.file_identity(base)
    write(pa.table({"key": [f"other-{k}" for k in KEYS], "path": KEYS, "extra": KEYS}), str(tmp_path / "new"), 12)
    real_open = storage.open_parquet

    def replaced_once_opened(uri, *args, **kwargs):
        f = real_open(uri, *args, **kwargs)
        if uri == base and os.path.exists(tmp_path / "new"):
            os.replace(tmp_path / "new", base)
        return f

    monkeypatch.setattr(storage, "open_parquet", replaced_once_opened)
    if streamed:
        stats = merge_shard(job, REL)
    else:
        state = read_base(job, REL)
        assert state.base_input == read_identity
        stats = chain(job, state)
    assert read_identity != storage.file_identity(base)
    out = job.output_uri(REL)
    assert stats == ShardStats(REL, 12, os.path.getsize(out), 0, stats.seconds, stats.input_key,
                         merge_path if streamed else "decode")
    meta = pq.read_metadata(out)
    prov = read_provenance(meta)
    assert stats.input_key == prov["input_key"] != "" and prov["merge_semantics"] == MERGE_SEMANTICS_VERSION
    assert (prov["run_id"], prov["run_started"]) == ("run-1", "2026-12-05T09:00:00+00:00")
    assert prov["inputs"]["base"] == read_identity
    assert "overwrite_id" not in prov  # not an overwrite run
    encodings = {meta.schema.column(c).name: meta.row_group(0).column(c).encodings for c in range(meta.num_columns)}
    dictionary = {name for name, used in encodings.items() if any("DICTIONARY" in e for e in used)}
    if streamed and merge_path == "copy":  # the base's chunks as the base has them (pyarrow's default: a dictionary)
        assert dictionary == {"aes", "key", "path"}, encodings
    else:  # written by the decode path: not the key columns (key, path), not a float
        assert dictionary == {"aes"}, encodings


def test_the_shard_key_of_recorded_inputs_never_changes():
    """Outputs record the key they were made under and the planner compares it with the key of the inputs it
    lists: a change of the formula would make every stored output stale (a deliberate change bumps
    MERGE_SEMANTICS_VERSION, and this value with it)."""
    inputs_ = {"base": "size=10;mtime_ns=20", "operations": ["size=3;etag=abc", "absent"]}
    assert shard_key("fp", "a/part-0.parquet", inputs_) == KEY_OF_V2


@pytest.mark.parametrize("streamed", [False, True], ids=["steps", "streamed"])
def test_a_declared_extension_missing_fails_before_writing(tmp_path, streamed):
    """No step skipped: a declared extension column absent from the output fails the write, nothing stored
    (by the steps, or by the streamed merge before its first window goes out)."""
    root = storage.normalize_prefix(str(tmp_path))
    inputs(root)
    job = job_for(root, "out")
    dataset = replace(job.pipeline.dataset, schema_extensions=(QUALITY,))
    job = replace(job, pipeline=replace(job.pipeline, dataset=dataset))
    with pytest.raises(ShardError, match=rf"^shard {REL}: writing .*declared extension column 'quality' "
                                         r"\(quality_score\) is missing from the output"):
        merge_shard(job, REL) if streamed else chain(job, read_base(job, REL))
    assert not storage.list_prefix(job.output_prefix).shards


def test_a_rename_after_a_skipped_optional_step_sees_its_history(tmp_path):
    """The optional merge finds no sibling and is skipped; the rename of the column it would have supplied is
    recorded absent (it reads the steps before it), not failed as a misconfigured column."""
    root = storage.normalize_prefix(str(tmp_path))
    inputs(root)
    job = job_for(root, "out")
    ops = (MergeFromSidecar(f"{root}missing/", ("dqm",), required=False), RenameColumns((("dqm", "score"),)))
    job = replace(job, pipeline=replace(job.pipeline, operations=ops))
    stats = chain(job, read_base(job, REL))
    prov = read_provenance(pq.read_metadata(job.output_uri(REL)))
    assert stats.rows == 12 and stats.skipped_ops == 1
    assert [op["status"] for op in prov["operations"]] == ["skipped_missing_sibling", "applied"]
    assert prov["operations"][1]["lineage"] == [{"change": "absent", "column": "score", "was": "dqm"}]
    assert pq.read_schema(job.output_uri(REL)).names == ["key", "path"]


def test_a_base_without_the_key_column_fails_as_a_shard_error(tmp_path):
    """The planner refuses such a base; the steps alone still fail it naming the shard (the check has no keys
    to compare), never with a bare error from reading it."""
    root = storage.normalize_prefix(str(tmp_path))
    storage.write_atomic(pa.table({"path": ["a", "b"], "image": [b"x", b"y"]}), f"{root}base/{REL}")
    job = job_for(root, "out")
    job = replace(job, pipeline=replace(job.pipeline, operations=()))
    state = read_base(job, REL)
    assert state.base_keys is None and state.table.column_names == ["path"]
    with pytest.raises(ShardError, match=rf"^shard {REL}: verifying {job.output_uri(REL)}: "):
        chain(job, state)



def written_with_key_second(tmp_path, merge=None):
    """An output merged (by the steps, or by `merge`) from a base whose key is its second column and that
    carries the declared `quality`."""
    root = storage.normalize_prefix(str(tmp_path))
    inputs(root)
    base = f"{root}base/{REL}"
    table = pq.read_table(base)
    storage.write_atomic(pa.table({"path": table["path"], "key": table["key"], "quality": [0.5] * 12}), base)
    job = job_for(root, "out")
    job = replace(job, pipeline=replace(job.pipeline, dataset=replace(job.pipeline.dataset,
                                                                      schema_extensions=(QUALITY,))))
    stats = merge(job, REL) if merge else chain(job, read_base(job, REL))
    return job, stats


def test_the_check_of_a_stored_output_reads_the_key_columns_by_name(tmp_path):
    """The check of an output found stored (a retried or cached step: no payload, no keys kept) reads the key
    column of the output and of the base by name, wherever it stands; it gives the input key recorded."""
    job, stats = written_with_key_second(tmp_path)
    assert pq.read_schema(job.output_uri(REL)).names[:2] == ["path", "key"]
    found = ShardStats(REL, 12, stats.bytes)
    assert check_written(job, REL, found) == replace(found, input_key=stats.input_key)


def test_the_streamed_merge_checks_the_base_keys_by_name(tmp_path):
    """merge_shard (the fused task) rereads the base's key column by name for its check: a key that is not
    the base's first column still checks. Its stats give the seconds the shard took."""
    started = time.perf_counter()
    job, stats = written_with_key_second(tmp_path, merge_shard)
    assert 0 < stats.seconds < time.perf_counter() - started  # the shard's own time, within the test's
    assert stats.rows == 12 and pq.read_schema(job.output_uri(REL)).names[:2] == ["path", "key"]


def test_the_check_of_an_output_recorded_without_an_input_key_gives_an_empty_one(tmp_path):
    """An output written before provenance recorded its input key: checked, its key is empty (never current)."""
    job, _ = written_with_key_second(tmp_path)

    table = pq.read_table(job.output_uri(REL))
    prov = json.loads(table.schema.metadata[PROVENANCE_KEY])
    del prov["input_key"]
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, PROVENANCE_KEY: json.dumps(prov)}),
                   job.output_uri(REL))
    assert check_written(job, REL, ShardStats(REL, 12, 0)).input_key == ""


def test_the_check_refuses_another_pipelines_output_and_a_missing_declared_extension(tmp_path):
    """A stored output another pipeline wrote, or one without a declared extension column (unless a skipped
    step explains it): the check fails it naming the shard."""
    job, stats = written_with_key_second(tmp_path)
    other = replace(job, pipeline=replace(job.pipeline, operations=job.pipeline.operations[:1]))
    with pytest.raises(ShardError, match=rf"^shard {REL}: verifying {job.output_uri(REL)}: provenance fingerprint "
                                         r"missing or different from this pipeline's$"):
        check_written(other, REL, ShardStats(REL, 12, 0))
    table = pq.read_table(job.output_uri(REL))
    pq.write_table(table.drop_columns(["quality"]).replace_schema_metadata(table.schema.metadata), job.output_uri(REL))
    with pytest.raises(ShardError, match=r"declared extension column 'quality' \(quality_score\) is missing"):
        check_written(job, REL, ShardStats(REL, 12, 0))
    assert check_written(job, REL, ShardStats(REL, 12, 0, skipped_ops=1)).input_key == stats.input_key


def damage_a_page(path: str, group: int, column: int) -> None:
    """Overwrite the data page of one column chunk past its page header's first bytes (its footer intact)."""
    page = pq.read_metadata(path).row_group(group).column(column)
    start, size = page.data_page_offset, page.total_compressed_size
    data = bytearray(Path(path).read_bytes())
    data[start + 20:start + size - 2] = b"\xff" * (size - 22)
    Path(path).write_bytes(bytes(data))


def test_a_base_unreadable_past_its_first_windows_names_the_shard_and_the_base(tmp_path):
    """The streamed merge reads the base a window at a time: a data page damaged in a later row group fails
    that window's read, named as the base's (nothing published)."""
    root = storage.normalize_prefix(str(tmp_path))
    job = job_for(root, "out")
    job = replace(job, pipeline=replace(job.pipeline, operations=()), recompress="zstd")  # the copy decodes keys only
    base = job.base_uri(REL)
    keys = [f"k{i:04d}" for i in range(200)]
    write(pa.table({"key": keys, "path": keys}), base, 50)
    damage_a_page(base, group=2, column=1)
    with pytest.raises(ShardError, match=rf"^shard {REL}: reading base shard {base}: not a readable parquet file"):
        merge_shard(job, REL)
    assert not storage.list_prefix(job.output_prefix).shards


def test_a_sibling_unreadable_past_its_first_windows_names_the_shard_and_the_step(tmp_path):
    """A data page damaged in a later row group of a sibling fails that window's step, named by shard and
    operation (nothing published)."""
    root = storage.normalize_prefix(str(tmp_path))
    job = job_for(root, "out")
    job = replace(job, pipeline=replace(job.pipeline, operations=job.pipeline.operations[:1]))
    keys = [f"k{i:04d}" for i in range(200)]
    write(pa.table({"key": keys, "path": keys}), job.base_uri(REL), 50)
    sibling = f"{root}dqm/{REL}"
    write(pa.table({"key": keys, "dqm": [float(i) for i in range(200)]}), sibling, 50)
    damage_a_page(sibling, group=2, column=1)
    with pytest.raises(ShardError, match=rf"^shard {REL}: operations\[0\] \(merge_from_sidecar from {root}dqm/\): "):
        merge_shard(job, REL)
    assert not storage.list_prefix(job.output_prefix).shards


def test_a_shards_inputs_are_fetched_ahead_with_the_columns_each_step_reads(tmp_path, monkeypatch):
    """The base without the image column, a sibling with `columns` its key and those, one without them all but the
    image column: what fetch_inputs_ahead asks storage.fetch_ahead for, object by object, each within what the
    window budget has left (all of it, where nothing was fetched)."""
    root = storage.normalize_prefix(str(tmp_path))
    job = job_for(root, "out")
    asked = []
    monkeypatch.setattr(storage, "fetch_ahead", lambda uri, wanted, limit: asked.append((uri, wanted, limit)) or 0)
    kernel.fetch_inputs_ahead(job, REL)
    columns = ["key", "path", "image", "dqm", "aes"]
    assert [(uri, [c for c in columns if wanted(c) is True], limit) for uri, wanted, limit in asked] == [
        (f"{root}aes/{REL}", ["key", "path", "dqm", "aes"], job.window_bytes),  # the siblings first, the last first
        (f"{root}dqm/{REL}", ["key", "dqm"], job.window_bytes),
        (f"{root}base/{REL}", ["key", "path", "dqm", "aes"], job.window_bytes)]
