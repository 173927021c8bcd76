"""Parquet files through pyarrow, read and written in record batches (memory stays flat).

Reading: each row's ``values`` are the Python values pyarrow gives (``int``, ``float``,
``str``, ``bool``, ``datetime``, ``Decimal``, ``None`` for null).  Columns with a nested type
(struct, list, map) cannot be put into a prompt and are refused, naming the column; so are
duplicate column names.

Writing: the result file is the input's record batches, unchanged (same schema, same types,
same row order, same file metadata), with the added columns appended.  Added columns are
typed: ``column_types`` maps a name to ``"string"``, ``"int64"``, ``"double"`` or ``"bool"``
(token counts are ``int64``; structured-output fields follow their JSON-schema type).  A value
that does not fit its column's type is written as null.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from batchgrader.pipeline.formats.common import InputError, MissingColumn, Row, text_of

BATCH_ROWS = 8192


@dataclass(frozen=True)
class ParquetLayout:
    path: Any
    columns: tuple[str, ...]
    fmt: str = "parquet"


def _open_file(path: Any, source: Any) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # a buffered stream, no pre-buffering: column chunks are read and decoded page by page,
        # so memory follows the record batch, not the row group (which may be the whole file)
        return pq.ParquetFile(source, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(path, f"not a readable Parquet file (corrupt or misnamed?): {exc}") from None


class ParquetReader:
    """Rows of a Parquet file, one record batch at a time; create it with ``open_table``."""

    fmt = "parquet"

    def __init__(self, source: str | os.PathLike[str] | IO[bytes], required_columns: Iterable[str] = ()):
        import pyarrow as pa

        self.path: Any = source if isinstance(source, (str, os.PathLike)) else getattr(source, "name", None)
        self._file = _open_file(self.path, source)
        try:
            schema = self._file.schema_arrow
            names = list(schema.names)
            seen: set[str] = set()
            for n in names:
                if n in seen:
                    raise InputError(self.path, "duplicate column names in the file", None, n)
                seen.add(n)
            for field in schema:
                if pa.types.is_nested(field.type):
                    raise InputError(
                        self.path,
                        f"the column has a nested type ({field.type}) that cannot be put into a prompt; flatten it first",
                        None,
                        field.name,
                    )
            for name in required_columns:
                if name not in seen:
                    found = ", ".join(repr(c) for c in names)
                    raise MissingColumn(self.path, f"required column not found; the file has: {found}", None, name, names)
            if self._file.metadata.num_rows == 0:
                raise InputError(self.path, "the file has no rows")
        except BaseException:
            self.close()
            raise
        self.columns: list[str] = names

    @property
    def layout(self) -> ParquetLayout:
        return ParquetLayout(self.path, tuple(self.columns))

    def __iter__(self) -> Iterator[Row]:
        import pyarrow as pa

        number = 0
        try:
            for batch in self._file.iter_batches(batch_size=BATCH_ROWS, use_threads=False):
                for values in batch.to_pylist():
                    number += 1
                    yield Row(number, number, values)
        except pa.ArrowException as exc:
            raise InputError(self.path, f"unreadable Parquet data after row {number}: {exc}") from None

    def close(self) -> None:
        f, self._file = getattr(self, "_file", None), None
        if f is not None:
            f.close()

    def __enter__(self) -> ParquetReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _arrow_type(name: str) -> Any:
    import pyarrow as pa

    return {"int64": pa.int64(), "double": pa.float64(), "bool": pa.bool_()}.get(name, pa.string())


def _coerce(v: Any, kind: str) -> Any:
    if v is None:
        return None
    if kind == "int64":
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            return v
        return int(v) if isinstance(v, float) and v.is_integer() else None
    if kind == "double":
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if kind == "bool":
        return v if isinstance(v, bool) else None
    return text_of(v)


class ParquetWriter:
    """The input's record batches with the added columns appended, written to ``target``."""

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[bytes],
        layout: ParquetLayout,
        added_columns: Sequence[str] = (),
        *,
        column_types: Mapping[str, str] | None = None,
    ):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.layout = layout
        self.fmt = "parquet"
        clash = set(added_columns) & set(layout.columns)
        if clash:
            raise ValueError(f"output column {sorted(clash)[0]!r} appears twice (an added column clashes with an input column?)")
        types = dict(column_types or {})
        self._added = [(name, types.get(name, "string")) for name in added_columns]
        self._source = _open_file(layout.path, layout.path)
        schema = self._source.schema_arrow
        for name, kind in self._added:
            schema = schema.append(pa.field(name, _arrow_type(kind)))
        self.schema = schema
        self._batches = self._source.iter_batches(batch_size=BATCH_ROWS)
        self._batch: Any = None
        self._buf: list[list[Any]] = [[] for _ in self._added]
        self._n = 0
        self._writer = pq.ParquetWriter(target, schema)
        self._closed = False

    def write(self, values: Mapping[str, Any]) -> None:
        if self._closed:
            raise ValueError("write to a closed TableWriter")
        if self._batch is None:
            self._batch = next(self._batches, None)
            if self._batch is None:
                raise ValueError("more records written than the file has rows")
        for buf, (name, kind) in zip(self._buf, self._added):
            buf.append(_coerce(values.get(name), kind))
        self._n += 1
        if self._n == self._batch.num_rows:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        arrays = list(self._batch.columns)
        arrays += [pa.array(buf, type=_arrow_type(kind)) for buf, (_n, kind) in zip(self._buf, self._added)]
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
        self._batch = None
        self._n = 0
        self._buf = [[] for _ in self._added]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._batch is not None or next(self._batches, None) is not None:
                raise ValueError("fewer records written than the file has rows")
            self._writer.close()
        finally:
            self._source.close()

    def __enter__(self) -> ParquetWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
            self._source.close()
