"""``python -m gpumem run offload``'s own options (torch-free: the parser is built without torch)."""

import argparse

CONFIG_NAMES = ("zero1", "zero1+cpu", "zero2", "zero2+cpu", "zero3", "zero3+cpu", "zero3+nvme")   # gpumem.dist.ds_offload.CONFIGS


def _positive(name: str):
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return int(text)
    return parse


def _configs(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in CONFIG_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown configuration {', '.join(bad) or repr(text)}; "
                                         f"accepted (comma-separated): {', '.join(CONFIG_NAMES)}")
    return names


def add_options(parser) -> None:
    """Add the offload experiment's flags: steps, configurations, swap folder, ladder size."""
    parser.add_argument("--steps", type=_positive("--steps"), default=4, help="training steps per configuration")
    parser.add_argument("--configs", type=_configs, default=CONFIG_NAMES,
                        help="comma-separated: " + ", ".join(CONFIG_NAMES))
    parser.add_argument("--nvme-path", dest="nvme_path", default=None,
                        help="folder on the drive to swap to (a temporary folder is made inside it and removed)")
    parser.add_argument("--ladder-mib", dest="ladder_mib", type=_positive("--ladder-mib"), default=256,
                        help="MiB moved per bandwidth rung")
