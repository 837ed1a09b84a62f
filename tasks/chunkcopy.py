"""The copy path: a shard's output made of its inputs' encoded column chunks, with only the keys decoded.

The output's row groups are the base's. Each keeps the base's column chunks (dictionary page, data pages,
statistics) as bytes, but the dropped image column's; a column an operation takes from its sibling is the
sibling's chunk as bytes where the sibling's row groups have the base's row counts and the same writer, and
otherwise (or when a step changed its values) that column alone is decoded and encoded into the base's row
groups. Before a byte is written every operation's keys are decoded and compared, a batch at a time, exactly as
the decode path compares them (tasks/ops/alignment.py). The footer is written afresh (tasks/footer.py): the
schema of the chunks it places, their new offsets, the output's `ARROW:schema` and provenance as pyarrow writes
them for the decode path's schema. `plan` says None, with the reason, for what cannot be copied safely; the
kernel then takes the decode path. docs/architecture.md has the picture.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from tasks import footer, storage
from tasks.ops.alignment import family as alignment_family
from tasks.ops.lineage import Change
from tasks.windows import BATCH_ROWS, RowWindows, batches

if TYPE_CHECKING:
    from fastparquet.cencoding import ThriftObject

PIECE = 8 << 20  # bytes read from an input at once: a chunk is copied through a buffer of at most this size
PIECE_ROWS = 1 << 17  # rows of a column encoded at once where an output row group has more (`streamed`)


class NotCopyable(Exception):
    """Why a shard takes the decode path (said in the shard task's log)."""


@dataclass
class Source:
    """An open file the output takes chunks or values from: the base (0) or operations[i]'s sibling (i + 1)."""

    file: object
    pf: pq.ParquetFile
    meta: ThriftObject
    tops: dict[str, footer.TopColumn]
    groups: list[int]  # rows of each row group
    data_end: int      # where the footer begins: every chunk lies before it

    @classmethod
    def of(cls, file, pf: pq.ParquetFile) -> Source:
        try:
            meta, data_end = footer.read(file, pf.metadata.serialized_size)
        except ValueError as exc:  # a footer not where its length says
            raise NotCopyable(str(exc)) from exc
        if footer.encrypted(meta):
            raise NotCopyable("an encrypted file")
        return cls(file, pf, meta, footer.top_columns(meta.schema), [g.num_rows for g in meta.row_groups], data_end)


@dataclass(frozen=True)
class Values:
    """An output column's values: column `column` of source `source`, then changed by each (step, name) of
    `steps` (a columnwise step, the column called `name` there)."""

    source: int
    column: str
    steps: tuple[tuple[int, str], ...] = ()


@dataclass
class Plan:
    """What the output is made of: each output column with its values, copied or encoded."""

    sources: list[Source]
    columns: list[tuple[str, Values]]   # output name -> values, in the output's order
    copied: set[str]                    # output columns whose chunks are copied (the rest are encoded)
    keys: list[tuple[int, Values]]      # (step, the target key's values at that step) of every step with a sibling
    schema: pa.Schema                   # the output's Arrow schema, metadata included (as the decode path's)
    streams: list = field(default_factory=list)

    @property
    def encoded(self) -> list[tuple[str, Values]]:
        return [(name, v) for name, v in self.columns if name not in self.copied]


def walk(base: Iterable[str], streams) -> tuple[list[tuple[str, Values]], list[tuple[int, Values]]]:
    """Every output column's values from the steps' lineage, and each sibling step's target key values before
    it. NotCopyable for a step that transforms values only it can compute on the whole window."""
    columns: dict[str, Values] = {name: Values(0, name) for name in base}
    keys = []
    for index, stream in enumerate(streams):
        record = stream.record
        if not record.applied:
            continue
        if stream.sibling is not None:
            key = stream.sibling.alignment.target_key
            if key not in columns:
                raise NotCopyable(f"operations[{index}]'s key {key!r} is not in the table")
            keys.append((index, columns[key]))
        renames = {}
        for change in record.lineage:
            if change.change is Change.REMOVE:
                columns.pop(change.column, None)
            elif change.change is Change.RENAME:
                renames[change.was] = change.column
            elif change.change is Change.TRANSFORM:
                if not stream.columnwise:
                    raise NotCopyable(f"operations[{index}] changes values of the whole window")
                values = columns[change.column]
                columns[change.column] = Values(values.source, values.column, (*values.steps, (index, change.column)))
            elif change.change in (Change.APPEND, Change.REPLACE):
                if stream.sibling is None:
                    raise NotCopyable(f"operations[{index}] makes the values of {change.column!r} itself")
                columns[change.column] = Values(index + 1, change.sibling or change.column)
        if renames:
            columns = {renames.get(name, name): values for name, values in columns.items()}
    return list(columns.items()), keys


def plan(base_file, base_pf: pq.ParquetFile, base_columns: list[str], streams, schema: pa.Schema) -> Plan:
    """The copy of a shard whose base is open as `base_file`/`base_pf` (the output keeping `base_columns` of
    it before the steps), through the opened `streams`, to an output of Arrow `schema`; NotCopyable if not."""
    if base_pf.metadata.num_rows == 0 or base_pf.metadata.num_row_groups == 0:
        raise NotCopyable("an empty shard")
    sources = [Source.of(base_file, base_pf)]
    for stream in streams:
        sibling = stream.sibling
        sources.append(Source.of(sibling.file, sibling.pf) if sibling is not None else None)
    columns, keys = walk(base_columns, streams)
    if [name for name, _ in columns] != schema.names:
        raise NotCopyable("the steps' lineage does not give the stream's columns")
    base = sources[0]
    copied = set()
    for name, values in columns:
        source = sources[values.source]
        if values.steps or source.groups != base.groups:
            continue
        if values.source and source.meta.created_by != base.meta.created_by:
            continue  # its statistics are read as the base's writer wrote them: encode it
        if _copyable(source, values.column):
            copied.add(name)
        elif source is base:
            raise NotCopyable(f"base column {values.column!r} cannot be copied safely")
    result = Plan(sources, columns, copied, keys, schema, list(streams))
    _check_schema(result)
    return result


def _copyable(source: Source, column: str) -> bool:
    """Whether the column's schema elements and chunks survive the footer's writer and every chunk lies in the
    file, between the leading magic and the footer."""
    top = source.tops.get(column)
    if top is None or not all(footer.lossless(e) for e in top.elements):
        return False
    try:
        [footer.writable(e) for e in top.elements]
    except ValueError:
        return False
    for group in source.meta.row_groups:
        for leaf in top.leaves:
            chunk = group.columns[leaf]
            start, length = footer.chunk_range(chunk)
            if chunk.file_path or not footer.chunk_lossless(chunk) or start < 4 or length <= 0 or (
                    start + length > source.data_end):
                return False
    return True


def reference(schema: pa.Schema, plain: Iterable[str]) -> ThriftObject:
    """The footer pyarrow writes for `schema` (no rows), as the decode path's writer is set up: its key-value
    metadata (`ARROW:schema`, provenance) is the output's, its leaves' physical types what the copy must match."""
    sink = pa.BufferOutputStream()
    with storage.parquet_writer(sink, schema, plain):
        pass
    buf = sink.getvalue()
    return footer.read(pa.BufferReader(buf), pq.ParquetFile(pa.BufferReader(buf)).metadata.serialized_size)[0]


def _check_schema(p: Plan) -> None:
    """The copied columns' leaves are those pyarrow would write for the output schema (physical type and
    repetition, leaf by leaf): a column stored otherwise is read back as another type by some reader."""
    ref = footer.top_columns(reference(p.schema.remove_metadata(), ()).schema)
    for name, values in p.columns:
        if name not in p.copied:
            continue
        mine = p.sources[values.source].tops[values.column].elements
        want = ref[name].elements
        shape = [(e.type, e.repetition_type, e.num_children or 0) for e in mine]
        if shape != [(e.type, e.repetition_type, e.num_children or 0) for e in want]:
            raise NotCopyable(f"column {name!r} is stored as other physical types than the output's")


# ---------------------------------------------------------------- the keys, before anything is written

def changed(p: Plan, values: Values, array, offset: int, step_failed):
    """`array` (rows from `offset`) through the steps that change `values`; a step's error named by its step."""
    for step, name in values.steps:
        try:
            array = p.streams[step].apply(pa.table({name: array}), offset)[name]
        except Exception as exc:
            raise step_failed(step, exc) from exc
    return array


def value_batches(p: Plan, values: Values, step_failed) -> Iterator[pa.Array]:
    """The values of an output column (or of a key at a step) over the whole shard, a batch at a time."""
    offset = 0
    for batch in batches(p.sources[values.source].pf, [values.column]):
        array = changed(p, values, batch.column(0), offset, step_failed)
        offset += len(array)
        yield array


def in_step(a: Iterable[pa.Array], b: Iterable[pa.Array]) -> Iterator[tuple[pa.Array | None, pa.Array | None]]:
    """Two columns read in batches of any sizes, as pairs of equally long slices; a side that ends first gives
    None for the other's rest."""
    a, b = iter(a), iter(b)
    left = right = None
    while True:
        if left is None or not len(left):
            left = next(a, None)
        if right is None or not len(right):
            right = next(b, None)
        if left is None or right is None:
            if left is not None or right is not None:
                yield left, right
            return
        n = min(len(left), len(right))
        if n:
            yield left.slice(0, n), right.slice(0, n)
        left, right = left.slice(n), right.slice(n)


def check_steps(p: Plan, step_failed) -> None:
    """What the decode path's steps would refuse, before a byte is written: every sibling step's keys against
    its target key's values, a batch at a time, exactly as the decode path compares them (Alignment: every bad
    row counted, the first named), then every changing step over its columns (a cast that does not fit);
    `step_failed(index, exc)` names a failure by its step."""
    for index, target in p.keys:
        sibling = p.streams[index].sibling
        alignment = sibling.alignment
        if same_key_bytes(p, target, sibling):
            continue
        offset = 0
        try:
            source_key = batches(sibling.pf, [alignment.source_key])
            for left, right in in_step(value_batches(p, target, step_failed), (b.column(0) for b in source_key)):
                if left is None or right is None:
                    break  # row counts were compared from footers when the step opened
                alignment.check(pa.table({alignment.target_key: left}), pa.table({alignment.source_key: right}),
                                offset)
                offset += len(left)
            alignment.finish()
        except Exception as exc:
            raise step_failed(index, exc) from exc
    for _, values in p.encoded:
        if values.steps:
            for _ in value_batches(p, values, step_failed):
                pass


def same_key_bytes(p: Plan, target: Values, sibling) -> bool:
    """Whether a step's keys are equal by their bytes, without decoding them: the target key is a column as its
    source stores it (no step changed it), the sibling's key column holds the same chunks byte for byte
    (same_chunks) as the same Arrow type of a key family, and no chunk holds a null (a null key is never
    equal): a required column, or statistics that count no null in every chunk. Otherwise the keys are
    decoded and compared. Equal bytes under equal metadata decode to equal values: what comparing them decoded
    would find, as no value is null and no key type has a NaN."""
    if target.steps:
        return False
    source, keys = p.sources[target.source], sibling.alignment
    kind = source.pf.schema_arrow.field(target.column).type
    if alignment_family(kind) is None or sibling.pf.schema_arrow.field(keys.source_key).type != kind:
        return False
    meta = source.pf.metadata
    leaf = _leaf(meta, target.column)
    if leaf is None or not (meta.schema.column(leaf).max_definition_level == 0 or all(
            _no_null(meta.row_group(g).column(leaf)) for g in range(meta.num_row_groups))):
        return False
    return bool(same_chunks(sibling.pf, sibling.file, source.pf, source.file, keys.source_key, target.column))


def _no_null(chunk: pq.ColumnChunkMetaData) -> bool:
    stats = chunk.statistics
    return stats is not None and stats.has_null_count and stats.null_count == 0


# ---------------------------------------------------------------- the output's bytes

class Pieces:
    """Byte ranges of one open input, read through a buffer of at most PIECE bytes."""

    def __init__(self, file):
        self.file, self.start, self.buf = file, 0, memoryview(b"")

    def read(self, start: int, length: int) -> Iterator[memoryview]:
        end = start + length
        while start < end:
            if not self.start <= start < self.start + len(self.buf):
                self.file.seek(start)
                data = self.file.read(min(end - start, PIECE))
                if not data:
                    raise EOFError(f"a column chunk ends past the file's end (byte {start})")
                self.start, self.buf = start, memoryview(data)
            lo, hi = start - self.start, min(len(self.buf), end - self.start)
            yield self.buf[lo:hi]
            start = self.start + hi


def same_chunks(written: pq.ParquetFile, written_file, base: pq.ParquetFile, base_file, column: str,
                base_column: str | None = None) -> bool | None:
    """Whether top-level column `column` of the written file holds the base's column chunks, byte for byte, by
    what pyarrow reads of both footers: None if the footers do not say the chunks are alike (another encoding,
    codec, size or row groups: the values must be decoded to be compared), else whether every chunk's bytes
    equal the base's (read through PIECE-sized buffers). Equal bytes under equal column metadata and schema
    decode to equal values."""
    a, b = written.metadata, base.metadata
    leaf_a, leaf_b = _leaf(a, column), _leaf(b, base_column or column)
    if leaf_a is None or leaf_b is None or a.num_row_groups != b.num_row_groups or (
            not a.schema.column(leaf_a).equals(b.schema.column(leaf_b))):
        return None
    ranges = []
    for g in range(a.num_row_groups):
        ca, cb = a.row_group(g).column(leaf_a), b.row_group(g).column(leaf_b)
        if a.row_group(g).num_rows != b.row_group(g).num_rows or _alike(ca) != _alike(cb):
            return None
        ranges.append((_start(ca), _start(cb), ca.total_compressed_size))
    pieces_a, pieces_b = Pieces(written_file), Pieces(base_file)
    return all(_same_bytes(pieces_a.read(start_a, length), pieces_b.read(start_b, length))
               for start_a, start_b, length in ranges)


def _same_bytes(a: Iterator[memoryview], b: Iterator[memoryview]) -> bool:
    """Whether two streams of byte pieces (cut anywhere) hold the same bytes."""
    x = y = memoryview(b"")
    while True:
        x = next(a, None) if x is not None and not len(x) else x
        y = next(b, None) if y is not None and not len(y) else y
        if x is None or y is None:
            return x is None and y is None
        n = min(len(x), len(y))
        if n and not pa.py_buffer(x[:n]).equals(pa.py_buffer(y[:n])):  # a memcmp (memoryviews compare by item)
            return False
        x, y = x[n:], y[n:]


def _leaf(meta: pq.FileMetaData, column: str) -> int | None:
    found = [i for i in range(meta.num_columns) if meta.schema.column(i).path == column]
    return found[0] if len(found) == 1 else None


def _start(chunk: pq.ColumnChunkMetaData) -> int:
    return chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset


def _alike(chunk: pq.ColumnChunkMetaData) -> tuple:
    """What two chunks must share for equal bytes to mean equal values (their pages' layout included)."""
    return (chunk.physical_type, chunk.compression, chunk.encodings, chunk.num_values, chunk.total_compressed_size,
            chunk.total_uncompressed_size, chunk.has_dictionary_page, chunk.data_page_offset - _start(chunk))


def encoded_group(p: Plan, readers: dict[int, RowWindows], rows: int, offset: int, plain, step_failed,
                  columns: list[tuple[str, Values]]) -> Source:
    """The encoded `columns` of one output row group of `rows` rows from row `offset`: decoded from their
    sources, changed by their steps and encoded as the decode path encodes them, in a parquet file of one row
    group."""
    taken = {source: reader.take(rows) for source, reader in readers.items()}
    arrays = [changed(p, values, taken[values.source][values.column], offset, step_failed) for _, values in columns]
    return one_group(pa.Table.from_arrays(arrays, schema=pa.schema([p.schema.field(name) for name, _ in columns])),
                     plain)


def one_group(table: pa.Table, plain) -> Source:
    """`table` encoded as the decode path encodes it, in a parquet file of one row group, held in memory."""
    sink = pa.BufferOutputStream()
    with storage.parquet_writer(sink, table.schema, plain) as writer:
        writer.write_table(table, row_group_size=max(table.num_rows, 1))
    buf = sink.getvalue()
    return Source.of(pa.BufferReader(buf), pq.ParquetFile(pa.BufferReader(buf)))


@dataclass(frozen=True)
class Leaf:
    """One leaf of a column encoded in pieces: `path` read from its source ("col", or "col.a.b" for a struct's
    leaf, which pyarrow reads as a struct of that branch alone), written as `field` (the output's field, that
    branch alone: its nullability gives the leaf's definition levels), with the column's steps (`changes`) or not."""

    path: str
    field: pa.Field
    changes: bool


def streamed(p: Plan, plain) -> dict[str, list[Leaf]]:
    """The encoded columns written a piece of PIECE_ROWS rows at a time, leaf by leaf, where the base has a row
    group larger than a piece: a primitive column (its steps applied to each piece), or a struct of them taken
    as its source holds it, each leaf read alone. Each leaf's pieces are encoded without a dictionary (a chunk
    has one dictionary page at most) and their data pages make one column chunk (tasks/footer.py `stitched`),
    so memory does not grow with the row group. Any other encoded column (a list, a map, a dictionary type, a
    struct a step changes) is encoded a whole row group at once."""
    if max(p.sources[0].groups) <= PIECE_ROWS:
        return {}
    out = {}
    for name, values in p.encoded:
        field = p.schema.field(name)
        if not pa.types.is_struct(field.type):
            if not (pa.types.is_nested(field.type) or pa.types.is_dictionary(field.type)):
                out[name] = [Leaf(values.column, field, True)]
        elif not values.steps and (leaves := struct_leaves(field, values.column)) is not None:
            out[name] = leaves
    return out


def struct_leaves(field: pa.Field, path: str) -> list[Leaf] | None:
    """The leaves of struct `field` (read from `path`) depth first, as Parquet lays them out; None if one is
    under a list, a map or a dictionary."""
    leaves = []
    for child in field.type:
        if pa.types.is_struct(child.type):
            inner = struct_leaves(child, f"{path}.{child.name}")
            if inner is None:
                return None
            leaves += [Leaf(leaf.path, field.with_type(pa.struct([leaf.field])), False) for leaf in inner]
        elif pa.types.is_nested(child.type) or pa.types.is_dictionary(child.type):
            return None
        else:
            leaves.append(Leaf(f"{path}.{child.name}", field.with_type(pa.struct([child])), False))
    return leaves


def leaf_reader(p: Plan, values: Values, leaf: Leaf) -> RowWindows:
    pf = p.sources[values.source].pf
    schema = None if leaf.changes else pa.schema([pf.schema_arrow.field(values.column).with_type(
        _read_type(pf.schema_arrow.field(values.column).type, leaf.path.split(".")[1:]))])
    return RowWindows(pf, [leaf.path], BATCH_ROWS, schema)


def _read_type(type_: pa.DataType, path: list[str]) -> pa.DataType:
    """The type pyarrow reads for the branch `path` of struct `type_`: the struct of that child alone."""
    if not path:
        return type_
    child = type_.field(path[0])
    return pa.struct([child.with_type(_read_type(child.type, path[1:]))])


def write_pieces(p: Plan, sink, position: int, name: str, values: Values, leaf: Leaf, reader: RowWindows,
                 rows: int, offset: int, plain, step_failed) -> tuple[ThriftObject, int]:
    """One leaf of column `name` in one output row group (`rows` rows from row `offset`, read on from `reader`)
    into `sink` at `position`, encoded a piece of at most PIECE_ROWS rows at a time without a dictionary, each
    piece's pages written as it is encoded. Returns the chunk's metadata and the position after it."""
    start, pieces, done = position, [], 0
    no_dictionary = [*plain, *storage.dictionary_columns(pa.schema([leaf.field]), ())]
    while True:
        n = min(PIECE_ROWS, rows - done)
        array = reader.take(n).column(0)
        if leaf.changes:
            array = changed(p, values, array, offset + done, step_failed)
        if array.type != leaf.field.type:
            array = array.cast(leaf.field.type)  # the same values; the output's nullability
        piece = one_group(pa.Table.from_arrays([array], schema=pa.schema([leaf.field])), no_dictionary)
        chunk = piece.meta.row_groups[0].columns[0]
        at, length = footer.chunk_range(chunk)
        for part in Pieces(piece.file).read(at, length):
            position = sink_write(sink, part, position)
        pieces.append((chunk, piece.pf.metadata.row_group(0).column(0).statistics))
        done += n
        if done >= rows:
            break
    return footer.stitched(pieces, start, [name, *chunk.meta_data.path_in_schema[1:]]), position


def write(p: Plan, sink, plain: Iterable[str], step_failed) -> int:
    """The output into `sink` (anything with `write`): the magic, each row group's chunks, the footer. Returns
    the bytes written."""
    plain = list(plain)
    base = p.sources[0]
    in_pieces = streamed(p, plain)
    whole = [(name, values) for name, values in p.encoded if name not in in_pieces]
    readers = {}
    for _, values in whole:
        readers.setdefault(values.source, set()).add(values.column)
    readers = {s: RowWindows(p.sources[s].pf, sorted(cols), min(max(base.groups), BATCH_ROWS))
               for s, cols in readers.items()}
    values_of = dict(p.columns)
    leaf_readers = {(name, leaf.path): leaf_reader(p, values_of[name], leaf)
                    for name, leaves in in_pieces.items() for leaf in leaves}
    # where the schema elements of a column encoded in pieces come from: a file of its field and no rows
    encoded = {name: one_group(pa.schema([p.schema.field(name)]).empty_table(), plain) for name in in_pieces}
    pieces: dict[int, Pieces] = {}
    position = sink_write(sink, footer.MAGIC, 0)
    groups, offset = [], 0
    for g, rows in enumerate(base.groups):
        if whole:
            this_group = encoded_group(p, readers, rows, offset, plain, step_failed, whole)
            encoded.update((name, this_group) for name, _ in whole)
        start, chunks = position, []
        for name, values in p.columns:
            if name in in_pieces:
                for leaf in in_pieces[name]:
                    chunk, position = write_pieces(p, sink, position, name, values, leaf,
                                                   leaf_readers[name, leaf.path], rows, offset, plain, step_failed)
                    chunks.append(chunk)
                continue
            if name in p.copied:
                source, column, group = p.sources[values.source], values.column, g
            else:
                source, column, group = encoded[name], name, 0
            reader = pieces.setdefault(id(source), Pieces(source.file))
            for leaf in source.tops[column].leaves:
                chunk = source.meta.row_groups[group].columns[leaf]
                at, length = footer.chunk_range(chunk)
                for piece in reader.read(at, length):
                    position = sink_write(sink, piece, position)
                chunks.append(footer.moved(chunk, position - length, [name, *chunk.meta_data.path_in_schema[1:]]))
        if whole:  # this row group's encoded file is done with
            pieces.pop(id(this_group), None)
        groups.append(footer.row_group(chunks, rows, start))
        offset += rows
    return sink_write(sink, footer.encode(file_meta(p, groups, encoded, plain)), position)


def sink_write(sink, data, position: int) -> int:
    sink.write(data)
    return position + len(data)


def file_meta(p: Plan, groups: list[ThriftObject], encoded: dict[str, Source], plain) -> ThriftObject:
    """The output's FileMetaData: the base's, with the schema of the chunks placed, their row groups, the
    column orders of their sources (where every source has them) and the decode path's key-value metadata."""
    base = p.sources[0]
    root = copy.deepcopy(base.meta.schema[0])
    root.num_children = len(p.columns)
    schema, orders = [root], []
    for name, values in p.columns:
        source, column = (p.sources[values.source], values.column) if name in p.copied else (encoded[name], name)
        top = source.tops[column]
        elements = [footer.writable(e) for e in top.elements]
        elements[0].name = name
        schema += elements
        source_orders = source.meta.column_orders
        orders += [source_orders[leaf] if source_orders else None for leaf in top.leaves]
    meta = base.meta.copy()  # shallow: its row groups are replaced, not changed
    meta.schema = schema
    meta.row_groups = groups
    meta.num_rows = sum(base.groups)
    meta.key_value_metadata = reference(p.schema, plain).key_value_metadata
    if all(order is not None for order in orders):
        meta.column_orders = orders
    elif meta.column_orders is not None:
        del meta.column_orders
    return meta
