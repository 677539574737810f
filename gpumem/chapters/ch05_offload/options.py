"""``python -m gpumem run offload``'s own options (torch-free: the parser is built without torch)."""

import argparse
import errno
import os
import re
import shutil
import tempfile

CONFIG_NAMES = ("zero1", "zero1+cpu", "zero2", "zero2+cpu", "zero3", "zero3+cpu", "zero3+nvme")   # gpumem.runs.ds_offload.CONFIGS


# Bounds (stated in --help by gpumem.cli): a step of every configuration takes seconds on CPU
# ranks, so 100 steps (25 x the default) is already many minutes; a 4 GiB rung is 16 x the default
# 256 MiB and times RAM and disk as well as a larger one would, which only takes longer.
MAX_STEPS, MAX_LADDER_MIB = 100, 4096


def _shown(text: str) -> str:
    r = repr(text)
    return r if len(r) <= 40 else f"{r[:39]}...' ({len(text):,} characters)"


def _positive(name: str, most: int):
    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*[0-9]{1,9}\s*", text) or not 0 < int(text) <= most:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer up to {most:,}, got {_shown(text)}")
        return int(text)
    parse.bound = most
    return parse


def _free_ram() -> int | None:
    """Bytes of RAM available now (Linux /proc/meminfo), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def check(args) -> None:
    """Across options, before anything is allocated: the ladder's rung (a file of ``--ladder-mib``
    MiB in the swap folder, two RAM buffers of it) fits the free disk and the available RAM."""
    from gpumem.errors import UsageError
    if args.nvme_path:
        try:
            os.stat(args.nvme_path)
        except OSError as err:       # a name the OS refuses (too long, a loop): one line, not a traceback
            if err.errno not in (errno.ENOENT, errno.ENOTDIR):      # those: the experiment says "no such folder"
                raise UsageError(f"--nvme-path {_shown(args.nvme_path)}: {os.strerror(err.errno)}; "
                                 "accepted: an existing folder on the drive to test") from None
    need = args.ladder_mib * 2**20
    folder = args.nvme_path or tempfile.gettempdir()
    if os.path.isdir(folder) and shutil.disk_usage(folder).free < need:
        raise UsageError(f"--ladder-mib {args.ladder_mib} writes {need:,} bytes to {folder}, which has "
                         f"{shutil.disk_usage(folder).free:,} free; accepted: a smaller --ladder-mib")
    ram = _free_ram()
    if ram is not None and 2 * need > ram:
        raise UsageError(f"--ladder-mib {args.ladder_mib} copies between two {args.ladder_mib} MiB buffers; "
                         f"{ram // 2**20:,} MiB of RAM is available; accepted: a smaller --ladder-mib")


def _configs(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))   # each once
    bad = [n if len(n) <= 30 else _shown(n) for n in names if n not in CONFIG_NAMES][:3]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown configuration {', '.join(bad) or _shown(text)}; "
                                         f"accepted (comma-separated): {', '.join(CONFIG_NAMES)}")
    return names


def add_options(parser) -> None:
    """Add the offload experiment's flags: steps, configurations, swap folder, ladder size."""
    parser.add_argument("--steps", type=_positive("--steps", MAX_STEPS), default=4, help="training steps per configuration")
    parser.add_argument("--configs", type=_configs, default=CONFIG_NAMES,
                        help="comma-separated: " + ", ".join(CONFIG_NAMES))
    parser.add_argument("--nvme-path", dest="nvme_path", default=None,
                        help="folder on the drive to swap to (a temporary folder is made inside it and removed)")
    parser.add_argument("--ladder-mib", dest="ladder_mib", type=_positive("--ladder-mib", MAX_LADDER_MIB),
                        default=256, help="MiB moved per bandwidth rung, no more than the free disk and half the free RAM")
    parser.set_defaults(_check_options=check)
