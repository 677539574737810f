"""``python -m gpumem check-env``: what is installed and what works, one line each.

Each check is OK, MISSING or INFO, and a MISSING line says how to fix it. Nothing here builds
or downloads anything; DeepSpeed ops are reported as found in the JIT cache.
"""

import importlib.metadata as md
import os
import platform
import shutil
import sys
from dataclasses import dataclass, asdict

from ..runs import dsops
from ..units import fmt

PINS = {"torch": "2.13.0", "deepspeed": "0.19.8"}


@dataclass
class Check:
    """One line of the check-env report: what was checked, its status, what was found and how to fix it."""
    name: str
    status: str   # OK | MISSING | INFO
    detail: str
    fix: str = ""


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def checks() -> list[Check]:
    """Run every check: Python, pinned packages, CPU and GPUs, DeepSpeed ops, libaio, chromium."""
    out = []
    py_ok = sys.version_info >= (3, 11)
    out.append(Check("python", "OK" if py_ok else "MISSING", platform.python_version(),
                     "" if py_ok else "install Python 3.11 or newer"))
    for pkg in ("torch", "deepspeed", "jupyterlab", "ipywidgets", "matplotlib", "nbval"):
        ver = _version(pkg)
        pin = PINS.get(pkg)
        ok = ver is not None and (pin is None or ver.split("+")[0] == pin)
        fix = "" if ok else "run `make lab` (it installs env/requirements.txt into .venv)"
        out.append(Check(pkg, "OK" if ok else "MISSING", ver or "not installed", fix))
    out.append(Check("cpu", "INFO", f"{os.cpu_count()} cores, {fmt(_ram_bytes(), 'GiB')} RAM"))
    out.extend(_gpu_checks())
    root = dsops.cache_dir()
    for name in dsops.OPS:
        if name == "async_io" and not dsops.libaio_present():
            out.append(Check(f"op {name}", "MISSING", "libaio headers not found",
                             "apt-get install libaio-dev, then `make lab` again"))
            continue
        ok = dsops.op_built(name, root)
        out.append(Check(f"op {name}", "OK" if ok else "MISSING",
                         f"built in {root}" if ok else "not built yet",
                         "" if ok else "python -m gpumem.runs.dsops prepare (make lab does it)"))
    out.append(Check("libaio", "OK" if dsops.libaio_present() else "MISSING",
                     "headers present" if dsops.libaio_present() else "headers not found",
                     "" if dsops.libaio_present() else "apt-get install libaio-dev (NVMe offload)"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    out.append(Check("chromium", "OK" if chromium else "MISSING", chromium or "not found",
                     "" if chromium else "apt-get install chromium (browser test only)"))
    return out


def _gpu_checks() -> list[Check]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return [Check("cuda", "INFO", "no CUDA device: notebooks run their CPU-scale experiments")]
    rows = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        rows.append(Check(f"gpu {i}", "OK", f"{props.name}, {fmt(props.total_memory, 'GiB')}"))
    return rows


def report(rows: list[Check] | None = None) -> str:
    """The checks as readable text, one line each (runs them unless ``rows`` is given)."""
    rows = checks() if rows is None else rows
    lines = []
    for c in rows:
        line = f"{c.status:8s} {c.name:20s} {c.detail}"
        if c.fix:
            line += f"   -> {c.fix}"
        lines.append(line)
    return "\n".join(lines)


def as_json(rows: list[Check] | None = None) -> dict:
    """The checks as one JSON-ready object; ``ok`` is false when any check is MISSING."""
    rows = checks() if rows is None else rows
    return {"checks": [asdict(c) for c in rows], "ok": all(c.status != "MISSING" for c in rows)}
