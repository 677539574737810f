"""Committed GPU measurements: the results-file format, reading it back, and what a notebook shows.

No GPU exists where most of the course is written and tested, so a chapter's CUDA branch cannot
store its numbers in the notebook. ``make gpu-check`` (``tools/gpu_check.py``) runs every
``gpu``-marked test on a CUDA machine; each test records what it measured through the
``gpu_record`` fixture under a key ``chNN.<what>``. The tool writes one file per run::

    results/gpu/<YYYY-MM-DD>_<gpu-slug>.json
    {"format": 1, "date": "2026-12-01", "gpu": "NVIDIA H200", "gpu_count": 1,
     "driver": "570.86.15", "cuda": "12.8", "torch": "2.13.0", "deepspeed": "0.19.8",
     "measurements": [{"test": "tests/test_04_x.py::test_y", "key": "ch04.peak_bytes",
                       "value": 123, "unit": "B"}, ...]}

A notebook calls :func:`show` next to its CUDA branch; it prints that chapter's committed
measurements labelled with the GPU and the date, or one line saying none are committed yet.
"""

import json
import re
from pathlib import Path

from gpumem.errors import UsageError
from gpumem.units import fmt_both

FORMAT = 1
RESULTS_DIR = Path(__file__).resolve().parents[2] / "results" / "gpu"
FIELDS = ("date", "gpu", "driver", "cuda", "torch", "deepspeed", "measurements")
ROW_FIELDS = ("test", "key", "value", "unit")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_KEY = re.compile(r"^(?:ch|lab)(\d{2})\.\S+$")     # a lab NN measurement belongs to chapter NN


def slug(gpu_name: str) -> str:
    """A file-name-safe form of a GPU name: ``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    text = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return text or "unknown-gpu"


def file_name(date: str, gpu_name: str) -> str:
    """The results file's name for a run on ``date`` (YYYY-MM-DD) on ``gpu_name``."""
    if not _DATE.match(date):
        raise UsageError(f"date {date!r} is not YYYY-MM-DD")
    return f"{date}_{slug(gpu_name)}.json"


def validate(data: dict) -> dict:
    """Check one results file's content against the format; returns it, or raises ValueError
    naming the first missing or malformed field."""
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise ValueError(f"results file lacks {', '.join(missing)}")
    if not _DATE.match(str(data["date"])):
        raise ValueError(f"date {data['date']!r} is not YYYY-MM-DD")
    for row in data["measurements"]:
        lacking = [f for f in ROW_FIELDS if f not in row]
        if lacking:
            raise ValueError(f"measurement {row!r} lacks {', '.join(lacking)}")
        if not _KEY.match(str(row["key"])):
            raise ValueError(f"measurement key {row['key']!r} is not chNN.<what> or labNN.<what>")
    return data


def write(data: dict, directory: Path = RESULTS_DIR) -> Path:
    """Validate and write a results file into ``directory``; returns its path."""
    validate(data)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name(data["date"], data["gpu"])
    path.write_text(json.dumps({"format": FORMAT, **data}, indent=1) + "\n")
    return path


def load(directory: Path = RESULTS_DIR) -> list[dict]:
    """Every committed results file in ``directory``, newest first (by date, then GPU name);
    each dict also carries ``"file"``, the file's name. A missing folder means none."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    runs = []
    for path in sorted(directory.glob("*.json")):
        data = validate(json.loads(path.read_text()))
        runs.append({**data, "file": path.name})
    return sorted(runs, key=lambda r: (r["date"], r["gpu"]), reverse=True)


def _chapter(chapter: str) -> str:
    text = str(chapter)
    if not re.fullmatch(r"\d{1,2}", text):
        raise UsageError(f"chapter {chapter!r} is not a chapter number; write it as \"04\"")
    return text.zfill(2)


def for_chapter(chapter: str, directory: Path = RESULTS_DIR) -> list[dict]:
    """The runs that measured something for ``chapter``, newest first, each with only that
    chapter's measurements."""
    num = _chapter(chapter)
    runs = []
    for run in load(directory):
        rows = [m for m in run["measurements"] if _KEY.match(m["key"]).group(1) == num]
        if rows:
            runs.append({**run, "measurements": rows})
    return runs


def values(chapter: str, directory: Path | None = None) -> list[tuple[dict, dict]]:
    """(run, {key: value}) for each committed run of ``chapter``, newest first: what the chapters'
    readings set beside their formulas (``directory`` None: the committed results)."""
    return [(run, {m["key"]: m["value"] for m in run["measurements"]})
            for run in for_chapter(chapter, RESULTS_DIR if directory is None else directory)]


def format_value(value, unit: str) -> str:
    """A measurement for display: bytes as an exact integer with GB and GiB, seconds with their
    unit, anything else as recorded."""
    if unit == "B" and isinstance(value, (int, float)):
        return f"{int(value):,} B ({fmt_both(value, 2)})"
    if isinstance(value, float):
        return f"{value:.4g} {unit}".rstrip()
    return f"{value} {unit}".rstrip()


def render(chapter: str, directory: Path = RESULTS_DIR) -> str:
    """The text :func:`show` prints."""
    num = _chapter(chapter)
    runs = for_chapter(num, directory)
    if not runs:
        return (f"No GPU measurements are committed for chapter {num} yet: run `make gpu-check` on a\n"
                f"CUDA machine, which writes results/gpu/<date>_<gpu>.json.")
    lines = [f"Committed GPU measurements for chapter {num} (measured by `make gpu-check`, not on this machine):"]
    for run in runs:
        count = f"{run['gpu_count']} x " if run.get("gpu_count", 1) != 1 else ""
        from .envcheck import PINS
        pinned = PINS["torch"]
        other = "" if run["torch"].split("+")[0] == pinned else f" (the course pins {pinned})"
        lines.append(f"  {count}{run['gpu']}, measured {run['date']}")
        lines.append(f"    driver {run['driver']}, CUDA {run['cuda']}, torch {run['torch']}{other}, "
                     f"DeepSpeed {run['deepspeed']}")
        shown = [m for m in run["measurements"] if not m["key"].startswith("lab")]
        width = max((len(m["key"]) for m in shown), default=0)
        for m in sorted(shown, key=lambda m: m["key"]):
            lines.append(f"  {m['key']:{width}s}  {format_value(m['value'], m['unit'])}")
        if len(shown) < len(run["measurements"]):     # review r25/r26 of lab 01: they answer a lab's GPU part
            hidden = len(run["measurements"]) - len(shown)
            lines.append(f"  ({hidden} lab measurement{'s' * (hidden > 1)} not shown: the lab's GPU part asks "
                         f"you to measure {'them' if hidden > 1 else 'it'})")
    return "\n".join(lines)


def show(chapter: str, directory: Path = RESULTS_DIR) -> None:
    """Print the committed GPU measurements of ``chapter`` ("04"), labelled with the GPU and the
    date of each run; where none are committed, one line saying so and how to produce them."""
    print(render(chapter, directory))
