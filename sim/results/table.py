"""One results table (``steps.csv``, ``requests.csv``, ...) as read-only numpy columns, and
its CSV file: every column typed by the schema (``schema.py``), every bad cell an error
naming the file, line and column."""

from __future__ import annotations

import csv
import io
import itertools
import math
import operator
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, ModuleType

import attrs
import numpy as np

from .csv_compiled import load_compiled_csv, read_number_lines
from .schema import FLOAT, INT, TEXT, Column, TableSchema

#: Array kinds (``dtype.kind``) each schema type takes from memory, cast to its dtype.
_KINDS = {INT: "iub", FLOAT: "iubf", TEXT: "OUS"}


class ResultsError(ValueError):
    """A results folder or table that cannot be used, naming the file, column and row."""


@attrs.frozen(eq=False)
class Table(Mapping[str, np.ndarray]):
    """One table as read-only numpy columns of equal length; a mapping of them.

    Attributes:
        name: where it came from (a file name), used in every error message.
        columns: column name -> ``[num_rows]`` array (int64, float64 or str, as the
            schema types it; other columns as they came).
    """

    name: str
    columns: Mapping[str, np.ndarray]

    @classmethod
    def from_columns(
        cls, name: str, columns: Mapping[str, object], schema: TableSchema | None = None
    ) -> Table:
        """Copy ``columns`` into a table, each typed as ``schema`` types it; a column of
        another type, not 1-D, or of another length is an error naming it."""
        frozen = {}
        for key, values in columns.items():
            array = np.array(values, copy=True)
            if array.ndim != 1:
                raise ResultsError(f"{name}: column {key!r} must be 1-D, got shape {array.shape}")
            column = schema.get(key) if schema is not None else None
            if column is not None:
                array = _typed(name, column, array)
            array.flags.writeable = False
            frozen[key] = array
        lengths = {key: len(array) for key, array in frozen.items()}
        if len(set(lengths.values())) > 1:
            raise ResultsError(f"{name}: columns have different lengths {lengths}")
        return cls(name, MappingProxyType(frozen))

    def __getitem__(self, key: str) -> np.ndarray:
        return self.columns[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def __eq__(self, other: object) -> bool:
        return self is other  # columns compare elementwise, not as one truth value

    __hash__ = object.__hash__

    @property
    def num_rows(self) -> int:
        """Rows of the table (0 for a table without columns)."""
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def column(self, key: str) -> np.ndarray:
        """The column ``key``; a missing column is an error naming the table."""
        if key not in self.columns:
            raise ResultsError(f"{self.name}: missing column {key!r} (has {sorted(self.columns)})")
        return self.columns[key]

    def require_rows(self, what: str) -> None:
        """Refuse an empty table with an error saying what needed rows."""
        if self.num_rows == 0:
            raise ResultsError(f"{self.name}: has no rows; {what} needs at least one")


def _typed(name: str, column: Column, array: np.ndarray) -> np.ndarray:
    """``array`` as ``column``'s dtype; an empty array takes any type."""
    if array.size and array.dtype.kind not in _KINDS[column.dtype]:
        raise ResultsError(
            f"{name}: column {column.name!r} must hold {column.dtype}, got {array.dtype}"
        )
    return array.astype(column.numpy_dtype, copy=False)


# ----------------------------------------------------------------------------- CSV


def csv_cells(values: np.ndarray) -> list[str]:
    """A column's CSV cells: floats by ``repr`` (NaN as an empty cell), the rest by ``str``."""
    if values.dtype.kind == "f":
        return ["" if v != v else repr(v) for v in values.tolist()]  # NaN -> empty
    return list(map(str, values.tolist()))


_SPECIAL = (",", '"', "\n", "\r")  # what makes csv quote a cell


def csv_lines(columns: Sequence[Sequence[str]], text: Sequence[bool]) -> str:
    """Rows of ``columns`` (cells, each column ``[k]``) as CSV text, each line ended by
    ``\\n``: the bytes ``csv.writer`` writes, joined at C speed where no cell needs
    quoting. ``text``: which columns may hold such cells (numbers never do)."""
    if not columns or not columns[0]:
        return ""
    plain = len(columns) > 1 and not any(
        special in cell
        for column, may in zip(columns, text, strict=True)
        if may
        for cell in column
        for special in _SPECIAL
    )
    if not plain:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(zip(*columns, strict=True))
        return buffer.getvalue()
    return "\n".join(map(",".join, zip(*columns, strict=True))) + "\n"


#: The compiled formatter and reader (``csv_compiled.py``; ``None``: Python alone).
_COMPILED = load_compiled_csv()
_NUMBERS = (np.dtype(np.float64), np.dtype(np.int64))  # what the compiled formatter reads


def csv_text(arrays: Sequence[np.ndarray], compiled: ModuleType | None = _COMPILED) -> str:
    """The CSV lines of the columns ``arrays`` (``[k]`` each): ``csv_lines`` of their
    ``csv_cells``, the same bytes, in one call of the ``compiled`` formatter where no cell
    needs quoting and every number column is float64 or int64 (``None``: Python alone)."""
    text = [array.dtype.kind in "OUS" for array in arrays]
    if (
        compiled is None
        or len(arrays) < 2
        or not all(may or array.dtype in _NUMBERS for array, may in zip(arrays, text, strict=True))
    ):
        return csv_lines([csv_cells(array) for array in arrays], text)
    columns = [
        csv_cells(array) if may else np.ascontiguousarray(array)
        for array, may in zip(arrays, text, strict=True)
    ]
    cells = "".join(["".join(column) for column, may in zip(columns, text, strict=True) if may])
    if any(special in cells for special in _SPECIAL):
        return csv_lines([csv_cells(array) for array in arrays], text)  # csv quotes them
    return compiled.csv_lines(columns)


class CsvWriter:
    """A CSV file written a chunk of rows at a time (:meth:`append`): a header, then
    :func:`csv_cells` of each column -- the same bytes however the rows are chunked."""

    def __init__(self, path: Path, names: Iterable[str]) -> None:
        self.path = path
        self.names = tuple(names)
        self._handle = path.open("w", newline="")
        self.write(csv_lines([[name] for name in self.names], [True] * len(self.names)))

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Rows: ``columns`` (``[k]`` each), one for each of :attr:`names`."""
        self.write(csv_text([np.asarray(columns[name]) for name in self.names]))

    def write(self, text: str) -> None:
        """Lines already made (:func:`csv_lines`)."""
        self._handle.write(text)

    def close(self) -> None:
        self._handle.close()


def write_csv(path: Path, columns: Mapping[str, np.ndarray]) -> None:
    """Write ``columns`` (``[num_rows]`` each) as one CSV file (:class:`CsvWriter`)."""
    writer = CsvWriter(path, columns)
    try:
        writer.append(columns)
    finally:
        writer.close()


def read_text(path: Path) -> str:
    """The text of ``path``; a missing file is an error naming it."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None


def header_names(path: Path, header: list[str], schema: TableSchema | None) -> list[str]:
    """The column names of a header, older names renamed (``schema.renamed``); a name
    twice is an error."""
    renamed = schema.renamed if schema is not None else {}
    names = [renamed.get(name, name) for name in header]
    for index, name in enumerate(names):
        if name not in names[:index]:
            continue
        first, second = header[names.index(name)], header[index]
        if first == second:
            raise ResultsError(f"{path}: column {first!r} appears twice in the header")
        old = first if first != name else second
        raise ResultsError(
            f"{path}: columns {old!r} (the older name) and {name!r} are one column; keep one"
        )
    return names


#: Rows :func:`iter_csv` parses at a time.
READ_ROWS = 1 << 16
#: Bytes the compiled reader is given at a time.
READ_BYTES = 1 << 22


def iter_csv(
    path: Path,
    schema: TableSchema | None = None,
    *,
    columns: Collection[str] | None = None,
    rows: int = READ_ROWS,
    compiled: ModuleType | None = _COMPILED,
) -> Iterator[Table]:
    """Read a CSV file with a header line a chunk of ``rows`` rows at a time (at least one
    chunk, empty for a file of a header alone), typed by ``schema`` (a column it does not
    name is numbers when every cell of the chunk parses as one, else text); ``columns``
    keeps only those (those the file lacks are left out: a reader that needs one says so).
    Chunks of plain lines whose columns are all numbers of ``schema`` are read by the
    ``compiled`` reader (``csv_compiled.py``; ``None``: Python alone), from the first chunk it
    refuses on by Python. Memory: one chunk."""
    try:
        raw = path.open("rb")
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None
    with raw:
        header, start, line = None, 0, 2
        if compiled is not None:
            header, wanted = _plain_header(path, raw.readline(), schema, columns)
            if header is not None:
                chunks = _compiled_chunks(raw, path, schema, header, wanted, rows, compiled)
                rest = yield from chunks
                if rest is None:
                    return
                start, line = rest
        raw.seek(start)
        handle = io.TextIOWrapper(raw, newline="")
        if header is None:
            header = header_names(path, next(csv.reader(handle), None) or _no_header(path), schema)
        wanted = header if columns is None else [c for c in header if c in set(columns)]
        while True:
            lines = list(itertools.islice(handle, rows))
            numbers = _number_columns(schema, header, wanted, lines)
            if numbers is not None:
                yield Table.from_columns(path.name, numbers, schema)
                body_rows = len(lines)
            else:
                body = _rows(lines)
                if body or line == 2:
                    yield _chunk(path, schema, header, wanted, body, line)
                body_rows = len(body)
            if body_rows < rows:
                return
            line += body_rows


def _plain_header(
    path: Path, first: bytes, schema: TableSchema | None, columns: Collection[str] | None
) -> tuple[list[str] | None, list[str]]:
    """The header and the columns wanted of a file whose ``first`` line is plain (ASCII,
    no quote, no carriage return, ended by ``\n``) and whose wanted columns are numbers of
    ``schema``: what the compiled reader may read; ``(None, [])`` otherwise."""
    cells = first.removesuffix(b"\n")
    if (
        schema is None
        or not cells
        or not first.endswith(b"\n")
        or not cells.isascii()
        or any(mark in cells for mark in (b'"', b"\r"))
    ):
        return None, []
    header = header_names(path, cells.decode().split(","), schema)
    wanted = header if columns is None else [c for c in header if c in set(columns)]
    types = [schema.get(key) for key in wanted]
    if not wanted or any(c is None or c.dtype == TEXT for c in types):
        return None, []
    return header, wanted


def _compiled_chunks(
    raw: io.BufferedReader,
    path: Path,
    schema: TableSchema,
    header: list[str],
    wanted: list[str],
    rows: int,
    compiled: ModuleType,
) -> Generator[Table, None, tuple[int, int] | None]:
    """The chunks of ``raw`` (past its header) that ``compiled`` reads, each of ``rows``
    lines (the last of fewer), from blocks of :data:`READ_BYTES`; returns ``None`` when it
    read them all, else the byte offset and line number of the chunk it refused (or of
    an empty first chunk), from which Python reads."""
    fields = [header.index(key) for key in wanted]
    dtypes = [schema.get(key).numpy_dtype for key in wanted]
    start, line = raw.tell(), 2  # the chunk's first line's
    data, at, final = b"", 0, False  # data[at:]: read, not parsed
    while True:
        columns = [np.empty(rows, dtype) for dtype in dtypes]
        filled, width = 0, len(header)
        while True:
            read = read_number_lines(compiled, data, at, width, fields, columns, filled, final)
            if read is None:
                return start, line
            filled, at = read
            if filled == rows or final:
                break
            more = raw.read(READ_BYTES)
            data, at, final = data[at:] + more, 0, not more
        if filled == 0 and line == 2:
            return start, line  # a header alone: Python gives its empty chunk
        if filled:
            parts = {key: column[:filled] for key, column in zip(wanted, columns, strict=True)}
            yield Table.from_columns(path.name, parts, schema)
        if filled < rows:
            return None
        start, line = raw.tell() - (len(data) - at), line + filled


def _number_columns(
    schema: TableSchema | None, header: list[str], wanted: list[str], lines: list[str]
) -> dict[str, np.ndarray] | None:
    """The ``wanted`` columns of CSV ``lines`` parsed in C (``np.loadtxt``, 5x faster),
    when each is a number column of ``schema`` and every line is plain (no quote, no
    blank line, as many fields as ``header``); ``None`` otherwise or on any cell it
    cannot parse, which :func:`_chunk` then reads cell by cell, naming the line."""
    columns = [schema.get(key) if schema is not None else None for key in wanted]
    if not lines or not wanted or any(c is None or c.dtype == TEXT for c in columns):
        return None
    text = "".join(lines)
    if '"' in text or set(map(operator.methodcaller("count", ","), lines)) != {len(header) - 1}:
        return None  # quotes, blank lines or a line of other fields: the careful reader
    dtype = [(c.name, np.int64 if c.dtype == INT else np.float64) for c in columns]
    usecols = [header.index(key) for key in wanted]
    parsed = _loadtxt(lines, usecols, dtype)
    if parsed is None and (",," in text or ",\n" in text or text.startswith(",")):
        # An empty number cell is NaN (``_parse_cell``); in an integer column "nan" is refused.
        for empty, nan in ((",,", ",nan,"), (",,", ",nan,"), (",\n", ",nan\n"), ("\n,", "\nnan,")):
            text = text.replace(empty, nan)
        text = ("nan" + text) if text.startswith(",") else text
        parsed = _loadtxt(io.StringIO(text), usecols, dtype)
    if parsed is None or parsed.shape != (len(lines),):
        return None
    return {key: parsed[key] for key in wanted}


def _loadtxt(source: Iterable[str], usecols: list[int], dtype: list) -> np.ndarray | None:
    """``[rows]`` records of the ``usecols`` fields of CSV lines ``source``, ``None``
    where a cell does not parse as its ``dtype``."""
    try:
        return np.loadtxt(
            source, delimiter=",", usecols=usecols, dtype=dtype, comments=None, ndmin=1
        )
    except (ValueError, OverflowError):
        return None


def _chunk(
    path: Path,
    schema: TableSchema | None,
    header: list[str],
    wanted: list[str],
    body: list[list[str]],
    line: int,
) -> Table:
    """The table of CSV rows ``body`` (the first on ``line``), columns ``wanted``."""
    for index, row in enumerate(body):
        if len(row) != len(header):
            raise ResultsError(
                f"{path}:{line + index}: {len(row)} fields, the header has {len(header)}"
            )
    parsed = {}
    for key in wanted:
        column = schema.get(key) if schema is not None else None
        dtype = column.dtype if column is not None else None
        cells = list(map(operator.itemgetter(header.index(key)), body))
        parsed[key] = _parse_column(path, key, dtype, cells, line)
    return Table.from_columns(path.name, parsed, schema)


def _rows(lines: list[str]) -> list[list[str]]:
    """CSV lines as rows of cells, blank lines left out. Lines without a quote are split
    at their commas (8x faster than ``csv``, the same cells); a chunk with one is read
    by ``csv`` (stepplan's tables never quote a line break, which would span chunks)."""
    if any('"' in line for line in lines):
        return [row for row in csv.reader(lines) if row]
    return [line.rstrip("\r\n").split(",") for line in lines if line.strip("\r\n")]


def _no_header(path: Path) -> list[str]:
    raise ResultsError(f"{path}: empty file, expected a header line")


def read_csv(path: Path, schema: TableSchema | None = None) -> Table:
    """Read one CSV file with a header line, typed by ``schema`` (:func:`iter_csv`'s
    chunks joined; a column it does not name that is text in any chunk is text)."""
    return join_tables(list(iter_csv(path, schema)), schema)


def join_tables(chunks: list[Table], schema: TableSchema | None = None) -> Table:
    """One table of ``chunks`` (tables of the same columns), in order."""
    columns = {}
    for name in chunks[0].columns:
        parts = [chunk[name] for chunk in chunks]
        if len({part.dtype.kind for part in parts}) > 1:  # an unknown column, text somewhere
            parts = [part.astype(str) for part in parts]
        columns[name] = np.concatenate(parts)
    return Table.from_columns(chunks[0].name, columns, schema)


def _parse_column(
    path: Path, key: str, dtype: str | None, texts: Sequence[str], first_line: int = 2
) -> np.ndarray:
    if dtype == TEXT:
        return np.array(texts, dtype=str)
    kind = np.int64 if dtype == INT else np.float64
    try:
        if kind is np.int64 or "" not in texts:
            return np.fromiter(map(int if kind is np.int64 else float, texts), kind, len(texts))
        nan = math.nan  # an empty cell: e.g. no TPOT for a one-token output
        return np.array([float(text) if text else nan for text in texts], dtype=np.float64)
    except (ValueError, OverflowError):
        pass
    # The fast conversion failed: find the line, or keep an unknown column as text.
    if dtype is None and not all(_is_number(text) for text in texts):
        return np.array(texts, dtype=str)
    return np.array(
        [_parse_cell(path, key, first_line + i, t, kind) for i, t in enumerate(texts)], kind
    )


def _is_number(text: str) -> bool:
    return text == "" or _parse_float(text) is not None


def _parse_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _parse_cell(path: Path, key: str, line: int, text: str, kind: type) -> float | int:
    if kind is np.float64:
        if text == "":
            return math.nan  # e.g. no TPOT for a one-token output
        value = _parse_float(text)
        if value is None:
            raise ResultsError(f"{path}:{line}: column {key!r} has {text!r}, expected a number")
        return value
    try:
        value = int(text)
    except ValueError:
        raise ResultsError(
            f"{path}:{line}: column {key!r} has {text!r}, expected an integer"
        ) from None
    if not -(2**63) <= value < 2**63:
        raise ResultsError(f"{path}:{line}: column {key!r} has {text!r}, beyond int64")
    return value
