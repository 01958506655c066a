"""Request traces: every supported file format into one :class:`RequestTable`.

Formats (``FORMATS``; one entry each in ``formats.TABLE``):

================= ===== =============================================================
name              kind  columns / keys used (any order, among any others)
================= ===== =============================================================
azure             CSV   ``TIMESTAMP`` (wall clock), ``ContextTokens``, ``GeneratedTokens``
                        (Azure LLM inference traces, code and conversation)
burstgpt          CSV   ``Timestamp`` (s), ``Request tokens``, ``Response tokens``
vidur             CSV   ``arrived_at`` (s), ``num_prefill_tokens``, ``num_decode_tokens``
lengths           CSV   a prompt-length and an output-length column, no arrival time
                        (``num_prefill_tokens``/``num_decode_tokens``,
                        ``input_tokens``/``output_tokens``, any other format's pair, ...)
mooncake          JSONL ``timestamp`` (ms), ``input_length``, ``output_length``,
                        optional ``hash_ids`` (one id per 512-token prefix block)
llmservingsim     JSONL ``input_toks``, ``output_toks``, ``arrival_time_ns``
llmservingsim-tsv TSV   the same columns, tab-separated (LLMServingSim's older layout)
================= ===== =============================================================

Reading (``reading.py``): the format is detected from the header row or the first
JSON object, names matched without regard to case; ``--format`` names it instead.
Files compressed with gzip (public traces often ship as ``.csv.gz``), bzip2 or xz are
read as they are, recognised by their magic bytes rather than their suffix. A UTF-8
byte-order mark, CRLF line endings, blank lines and tab- or semicolon-separated
columns are fine. A Git LFS pointer, a zip, zstd or Parquet file, binary data,
non-UTF-8 text and any malformed row are a :class:`TraceError` naming the file and
line, and nothing is read.

What the table holds:

- Arrival times are shifted so the first request arrives at 0, and sorted (stable).
  A trace whose times go backwards is sorted, not refused;
  :attr:`RequestTable.unsorted_line` names its first out-of-order line and the
  command line prints it as a one-line note.
- A format without arrival times (``lengths``) has every request arrive at 0, or
  Poisson arrivals when ``rate`` is given (``--rate``); the command line says which.
- Rows with zero prompt or output tokens (BurstGPT logs failed requests that way)
  are dropped and counted in :attr:`RequestTable.skipped` (a note on the command
  line); a trace with nothing else is an error.
- The simulator then drops requests longer than ``model.max_model_len`` (prompt plus
  output, as vLLM refuses them): :meth:`RequestTable.within_model_len`, counted in
  :attr:`RequestTable.rejected` and in ``summary.json``'s
  ``trace.rejected_max_model_len``.

Writing (``writing.py``): :func:`write_trace` writes any format (gzip-compressed for
a ``.gz`` path) so that :func:`load_trace` reads the same table back.
"""

from __future__ import annotations

from .formats import FORMATS, TABLE, TraceFormat
from .reading import detect_format, load_trace
from .request_table import ARRIVALS, RequestTable, TraceError
from .writing import write_trace

__all__ = [
    "ARRIVALS",
    "FORMATS",
    "TABLE",
    "RequestTable",
    "TraceError",
    "TraceFormat",
    "detect_format",
    "load_trace",
    "write_trace",
]
