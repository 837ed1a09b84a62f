"""A parquet file's footer as Parquet's Thrift structures (fastparquet's `ThriftObject`), for the copy path.

pyarrow reads footers but cannot write one that places another file's column chunks, so the copy path
(tasks/chunkcopy.py) reads and writes `FileMetaData` with fastparquet's Cython Thrift codec: ~20x faster than
thriftpy2's pure-Python compact protocol on a 100-row-group footer, and schemaless on reading (a field it has no
name for is kept). Its writer has two limits this module guards: it writes a struct's fields 1-13 only, and it
writes an int as i64 unless the struct it was read from marked it i32. Every struct written here is either
copied from a file (its markers come along) or built of i64s and lists; `lossless` refuses, for the decode
path, a schema element or chunk that would lose a field on the way out.

fastparquet's codec is loaded at its first use, without the package around it (`codec`): the package imports
pandas (~0.27 s here), which no command of ours needs.
"""
from __future__ import annotations

import copy
import functools
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastparquet.cencoding import ThriftObject


@functools.cache
def codec():
    """fastparquet's Cython Thrift codec (`ThriftObject`, `from_buffer`), loaded on its own (~1 ms): the fastparquet
    package's `__init__` imports pandas and its readers (~0.27 s here), none of which the codec needs, and nothing
    here needs either. Registered as `fastparquet.cencoding`, where the package's own import finds it. Another
    layout of the package (the extension not found beside its `__init__`) gets the package's own import."""
    import importlib.machinery
    import importlib.util
    import sys

    name = "fastparquet.cencoding"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("fastparquet")  # found, not imported
    spec = importlib.machinery.PathFinder.find_spec(name, package.submodule_search_locations) if package else None
    if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
        from fastparquet import cencoding

        return cencoding
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module

MAGIC = b"PAR1"
# ColumnMetaData fields the writer drops and the copy may lose: the bloom filter's place (left out: its
# offsets would be the base's), size statistics and geospatial statistics (optional: for planning only).
DROPPABLE_CHUNK_FIELDS = {14, 15, 16, 17}
LAST_WRITTEN_FIELD = 13
PATH_IN_SCHEMA = 3  # ColumnMetaData's field number
META_DATA = 3  # ColumnChunk's field number of its ColumnMetaData


def read(f, footer_size: int) -> tuple[ThriftObject, int]:
    """The FileMetaData of the open parquet file `f` (seekable), whose footer is `footer_size` bytes (pyarrow's
    `FileMetaData.serialized_size`), and the offset where the footer begins."""
    start = f.seek(0, 2) - 8 - footer_size
    f.seek(start)
    raw = bytes(f.read(footer_size + 8))
    if raw[-4:] != MAGIC or struct.unpack("<I", raw[-8:-4])[0] != footer_size:
        raise ValueError("footer is not where its length says (an encrypted or truncated file?)")
    return codec().from_buffer(raw[:-8], "FileMetaData"), start


def encode(meta: ThriftObject) -> bytes:
    """The footer's bytes as they end a file: FileMetaData, its length, the magic."""
    body = bytes(meta.to_bytes())
    return body + struct.pack("<I", len(body)) + MAGIC


@dataclass(frozen=True)
class TopColumn:
    """A top-level column of a file: its schema elements (the column's subtree, depth first) and the indexes
    of its leaves among the file's leaf columns (its chunks in every row group)."""

    name: str
    elements: list[ThriftObject]
    leaves: range


def top_columns(schema: list[ThriftObject]) -> dict[str, TopColumn]:
    """The file's top-level columns by name, from its flattened schema (schema[0] is the root)."""
    out: dict[str, TopColumn] = {}
    position, leaf = 1, 0
    for _ in range(schema[0].num_children or 0):
        start, first_leaf, pending = position, leaf, 1
        while pending:
            children = schema[position].num_children or 0
            pending += children - 1
            leaf += children == 0
            position += 1
        name = schema[start].name
        name = name.decode() if isinstance(name, bytes) else name  # the codec reads strings as bytes
        out[name] = TopColumn(name, schema[start:position], range(first_leaf, leaf))
    return out


def chunk_range(chunk: ThriftObject) -> tuple[int, int]:
    """(start, length) of a column chunk's bytes: from its dictionary page if it has one, else its first data
    page, `total_compressed_size` long (how Arrow's reader finds it)."""
    meta = chunk.meta_data
    start = meta.data_page_offset
    if meta.dictionary_page_offset and 0 < meta.dictionary_page_offset < start:
        start = meta.dictionary_page_offset
    return start, meta.total_compressed_size


def moved(chunk: ThriftObject, start: int, path: list[str]) -> ThriftObject:
    """A copy of `chunk`'s metadata for its bytes placed at `start` in the output, under the column path
    `path`: page offsets shifted alike; page indexes and the bloom filter left out (their offsets would point
    into the source file, and the decode path writes neither)."""
    out = chunk.copy()  # shallow: what changes below is its own dict and its ColumnMetaData's (a copy too)
    out.contents[META_DATA] = dict(chunk.contents[META_DATA])
    old, _ = chunk_range(chunk)
    shift = start - old
    meta = out.meta_data
    for name in ("data_page_offset", "dictionary_page_offset", "index_page_offset"):
        value = getattr(meta, name)
        if value:
            setattr(meta, name, value + shift)
    for number in DROPPABLE_CHUNK_FIELDS:  # the writer would drop them; the bloom filter's place is the source's
        meta.contents.pop(number, None)
    for name in ("offset_index_offset", "offset_index_length", "column_index_offset", "column_index_length"):
        if getattr(out, name) is not None:
            delattr(out, name)
    meta.contents[PATH_IN_SCHEMA] = list(path)  # setattr takes only lists of structs (it casts each item)
    data = out.contents
    if data.pop("i32", None):  # every int it was read with is an i32: name them, so file_offset goes out as i64
        data["i32list"] = [k for k, v in data.items() if isinstance(k, int) and type(v) is int]
    out.file_offset = start
    return out


ENCODINGS, NUM_VALUES, STATISTICS, ENCODING_STATS = 2, 5, 12, 13  # ColumnMetaData's fields
MAX, MIN, NULL_COUNT, DISTINCT_COUNT, MAX_VALUE, MIN_VALUE, MAX_EXACT, MIN_EXACT = range(1, 9)  # Statistics'


def stitched(pieces: list[tuple[ThriftObject, object]], start: int, path: list[str]) -> ThriftObject:
    """One column chunk made of the pages of several chunks without a dictionary page, written one after
    another from `start`: each piece is (its ColumnChunk, pyarrow's Statistics of it). Counts and sizes add up;
    the encodings and page counts are the pieces' together; the statistics' minimum and maximum are those of
    the piece whose value is least (greatest) as pyarrow reads them, their bytes as that piece's writer wrote
    them; null counts add up; the distinct count is left out (it does not add up)."""
    chunks = [chunk for chunk, _ in pieces]
    if any(c.meta_data.dictionary_page_offset for c in chunks):
        raise ValueError("a piece with a dictionary page cannot be stitched")
    out = moved(chunks[0], start, path)
    meta = out.meta_data.contents
    metas = [c.meta_data for c in chunks]
    meta[NUM_VALUES] = sum(m.num_values for m in metas)
    out.meta_data.total_compressed_size = sum(m.total_compressed_size for m in metas)
    out.meta_data.total_uncompressed_size = sum(m.total_uncompressed_size for m in metas)
    meta[ENCODINGS] = sorted({e for m in metas for e in m.contents.get(ENCODINGS) or ()})
    if all(ENCODING_STATS in m.contents for m in metas):
        kept: dict[tuple[int, int], ThriftObject] = {}  # (page type, encoding) -> its page count, in first order
        for s in (s for m in metas for s in m.encoding_stats):
            if (s.page_type, s.encoding) in kept:
                kept[s.page_type, s.encoding].count += s.count
            else:
                kept[s.page_type, s.encoding] = s.copy()
        out.meta_data.encoding_stats = list(kept.values())
    else:
        meta.pop(ENCODING_STATS, None)
    stats = [m.contents.get(STATISTICS) for m in metas]
    if any(s is None for s in stats):
        meta.pop(STATISTICS, None)
        return out
    merged = dict(stats[0])
    for number in (MAX, MIN, MAX_VALUE, MIN_VALUE, MAX_EXACT, MIN_EXACT, DISTINCT_COUNT):
        merged.pop(number, None)
    if all(NULL_COUNT in s for s in stats):
        merged[NULL_COUNT] = sum(s[NULL_COUNT] for s in stats)
    else:
        merged.pop(NULL_COUNT, None)
    ranged = [(read, raw) for (_, read), raw in zip(pieces, stats) if read is not None and read.has_min_max]
    if ranged:
        least = min(ranged, key=lambda piece: piece[0].min)[1]
        most = max(ranged, key=lambda piece: piece[0].max)[1]
        merged.update({k: least[k] for k in (MIN, MIN_VALUE, MIN_EXACT) if k in least})
        merged.update({k: most[k] for k in (MAX, MAX_VALUE, MAX_EXACT) if k in most})
    meta[STATISTICS] = merged
    return out


def encrypted(meta: ThriftObject) -> bool:
    return meta.encryption_algorithm is not None or any(
        chunk.crypto_metadata is not None or chunk.encrypted_column_metadata is not None or chunk.meta_data is None
        for group in meta.row_groups or () for chunk in group.columns)


def lossless(obj: ThriftObject | dict, droppable: set[int] = frozenset()) -> bool:
    """Whether the writer keeps every field of `obj` (nested structs too): none numbered above 13, but those
    in `droppable` at the top."""
    todo = [(obj if isinstance(obj, dict) else obj.contents, droppable)]
    while todo:  # a loop, not a recursion: it runs over every chunk of every copied column, a shard at a time
        fields, allowed = todo.pop()
        for key, value in fields.items():
            if not isinstance(key, int):
                continue  # the codec's i32 markers
            if key > LAST_WRITTEN_FIELD and key not in allowed:
                return False
            if isinstance(value, dict):
                todo.append((value, ()))
            elif isinstance(value, list):
                todo.extend((v, ()) for v in value if isinstance(v, dict))
    return True


def chunk_lossless(chunk: ThriftObject) -> bool:
    """A ColumnChunk whose fields all survive the writer (its ColumnMetaData may lose the droppable ones)."""
    data = chunk.contents
    meta = data.get(META_DATA)
    rest = {k: v for k, v in data.items() if k != META_DATA}
    return lossless(rest) and (meta is None or lossless(meta, DROPPABLE_CHUNK_FIELDS))


LOGICAL_TYPE, CONVERTED_TYPE, INTEGER = 10, 6, 10  # SchemaElement's fields; LogicalType's INTEGER member


def writable(element: ThriftObject) -> ThriftObject:
    """A copy of a schema element that the codec writes as read. An INTEGER logical type is given by its converted
    type alone (INT_8 ... UINT_64, which says the same): its bitWidth is an i8, which the codec reads without a
    mark and writes as an i64, and a reader then misses a required field. ValueError where none is set."""
    out = copy.deepcopy(element)
    logical = out.contents.get(LOGICAL_TYPE)
    if logical and INTEGER in logical:
        if out.contents.get(CONVERTED_TYPE) is None:
            raise ValueError(f"integer column {element.name!r} has a logical type and no converted type")
        del out.contents[LOGICAL_TYPE]
    return out


def key_value(key: str, value: str | bytes) -> ThriftObject:
    return codec().ThriftObject.from_fields("KeyValue", key=key, value=value)


def row_group(columns: list[ThriftObject], num_rows: int, start: int) -> ThriftObject:
    return codec().ThriftObject.from_fields(
        "RowGroup", columns=columns, num_rows=num_rows, file_offset=start,
        total_byte_size=sum(c.meta_data.total_uncompressed_size for c in columns),
        total_compressed_size=sum(c.meta_data.total_compressed_size for c in columns))
