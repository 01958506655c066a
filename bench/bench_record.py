"""The measurement record every script in ``bench/`` writes: one JSON file per run in
``bench/results/<benchmark>-<UTC timestamp>.json`` with the keys ``benchmark``, ``date``,
``device`` (machine, cpu, cores, memory_gib, python), ``command``, ``commit``, ``dirty``
and ``figures`` (numbers named with their unit: ``wall_s``, ``peak_mib``, ``p50_us``).

``python bench/render_results.py`` turns the newest record of each benchmark and device
into ``bench/RESULTS.md`` and the README's benchmark section.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
#: A record's file name: its benchmark, the UTC date and time it was written, and an
#: optional suffix (``-2`` for a second record in the same second, ``-transcribed-H200``
#: for figures copied from elsewhere). Its date is the record's ``date``.
FILE_NAME = re.compile(
    r"(?P<benchmark>.+)-(?P<date>\d{4}-\d{2}-\d{2})T\d{6}(-[A-Za-z0-9-]+)?\.json"
)
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _first_line(path: str, prefix: str) -> str | None:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(prefix)), None)


def device(machine: str | None = None) -> dict[str, Any]:
    """This host: ``machine`` names it; by default the GPU torch sees, else the cores and
    the CPU ("2-core AMD EPYC host": records group by it, so one host keeps one name)."""
    cpu = _first_line("/proc/cpuinfo", "model name") or platform.machine()
    gpu = _gpu_name()
    if machine is None:
        machine = gpu or f"{os.cpu_count()}-core {cpu} host"
    memory = _first_line("/proc/meminfo", "MemTotal")
    return {
        "machine": machine,
        "gpu": gpu,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory.split()[0]) / 2**20, 1) if memory else None,
        "python": platform.python_version(),
    }


def _gpu_name() -> str | None:
    # Only where the script already imported torch: a CPU benchmark pays no import for it.
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name())


def commit() -> dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout

    return {
        "commit": git("rev-parse", "HEAD").strip() or None,
        "dirty": bool(git("status", "--porcelain", "-uno").strip()),
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran this script, as a person would type it from the checkout."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = str(script)
    return " ".join(["python", shown, *(sys.argv[1:] if argv is None else argv)])


def new_record(
    benchmark: str, figures: dict[str, Any], *, machine: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The record of one run: the common keys, then ``extra`` (settings, notes), then
    ``figures``."""
    return {
        "benchmark": benchmark,
        "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "device": device(machine),
        "command": command_line(),
        **commit(),
        # Other processes on the host slow wall times: a reader weighs them by it.
        "load_average": [round(load, 2) for load in os.getloadavg()],
        **extra,
        "figures": figures,
    }


def host_of(device: dict[str, Any]) -> tuple[Any, ...] | None:
    """What identifies the host a record ran on (CPU, cores, memory, GPU), or None where
    the record does not say (figures transcribed from elsewhere)."""
    if not (device.get("cpu") and device.get("cores")):
        return None
    return (device["cpu"], device["cores"], device.get("memory_gib"), device.get("gpu"))


def naming_problems(records: dict[str, dict[str, Any]]) -> list[str]:
    """What breaks the naming rule in ``records`` (file name to record): a file name that
    is not ``<benchmark>-<date>T<HHMMSS>[-suffix].json`` of its record, a date that is not
    ``YYYY-MM-DD``, one host under two machine names."""
    problems = []
    names: dict[tuple[Any, ...], dict[str, str]] = {}
    for file, record in sorted(records.items()):
        date = str(record.get("date"))
        if not DATE.fullmatch(date):
            problems.append(f"{file}: date {date!r} is not YYYY-MM-DD")
        match = FILE_NAME.fullmatch(file)
        if match is None or match["benchmark"] != record.get("benchmark"):
            problems.append(f"{file}: not named <benchmark>-<YYYY-MM-DD>T<HHMMSS>.json")
        elif match["date"] != date:
            problems.append(f"{file}: named for {match['date']}, dated {date}")
        device = record.get("device")
        host = host_of(device) if isinstance(device, dict) else None
        if host is not None:
            names.setdefault(host, {}).setdefault(str(device.get("machine")), file)
    for machines in names.values():
        if len(machines) > 1:
            shown = ", ".join(f"{name!r} ({file})" for name, file in sorted(machines.items()))
            problems.append(f"one host under {len(machines)} machine names: {shown}")
    return problems


def write_record(record: dict[str, Any], folder: Path = RESULTS) -> Path:
    """Write ``record`` as a new file in ``folder`` (never over an earlier record) and
    say where on stderr."""
    folder.mkdir(parents=True, exist_ok=True)
    # The name carries the record's date (FILE_NAME), then the time it was written.
    stamp = f"{record['date']}T{dt.datetime.now(dt.timezone.utc):%H%M%S}"
    path = folder / f"{record['benchmark']}-{stamp}.json"
    suffix = 1
    while path.exists():
        suffix += 1
        path = folder / f"{record['benchmark']}-{stamp}-{suffix}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {path} (python bench/render_results.py updates RESULTS.md)", file=sys.stderr)
    return path


def record_run(
    benchmark: str,
    figures: dict[str, Any],
    *,
    machine: str | None = None,
    folder: Path = RESULTS,
    **extra: Any,
) -> Path:
    """Write the record of this run (``new_record`` then ``write_record``)."""
    return write_record(new_record(benchmark, figures, machine=machine, **extra), folder)


def numbers_of(row: dict[str, Any]) -> dict[str, Any]:
    """The numeric fields of a benchmark's table row (numbers and lists of numbers;
    plans, tensors and labels left out)."""

    def is_number(value: Any) -> bool:
        return type(value) in (int, float)

    return {
        key: value
        for key, value in row.items()
        if is_number(value)
        or (isinstance(value, (list, tuple)) and value and all(map(is_number, value)))
    }
