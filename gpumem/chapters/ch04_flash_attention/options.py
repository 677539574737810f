"""``python -m gpumem run attention``'s own options (torch-free: imported when the command line is built).

``--seqs`` takes a comma-separated list of sequence lengths (4k = 4096); the attention shape is
``--heads``, ``--kv-heads`` (GQA when fewer), ``--head-dim``; ``--block`` is the tiled kernel's
key block and ``--causal`` masks future keys. Bad values raise ``UsageError`` (exit status 2).
"""

import argparse
import re

MAX_SEQ = 16384        # naive fp32 scores at 16k are 1 GiB a head: the most a laptop should try
DEFAULT_SEQS = (256, 512, 1024, 2048, 4096, 8192)


def seq_list(text: str) -> tuple[int, ...]:
    """``"256,1024,8k"`` -> (256, 1024, 8192): positive lengths up to 16384, k = 1024."""
    out = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", part)
        value = int(m.group(1)) * (1024 if m.group(2) else 1) if m else 0
        if not 0 < value <= MAX_SEQ:
            raise argparse.ArgumentTypeError(f"--seqs must be comma-separated lengths from 1 to {MAX_SEQ} "
                                             f"such as 256,1024,4k, got {text!r}")
        out.append(value)
    return tuple(out)


def _positive(name: str, most: int):
    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*\d+\s*", text) or not 0 < int(text) <= most:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number from 1 to {most}, got {text!r}")
        return int(text)
    return parse


def add_options(parser) -> None:
    """Add ``--seqs``, ``--heads``, ``--kv-heads``, ``--head-dim``, ``--block`` and ``--causal``."""
    parser.add_argument("--seqs", type=seq_list, default=DEFAULT_SEQS,
                        help="sequence lengths, comma-separated (256,512,1024,2048,4096,8192)")
    parser.add_argument("--heads", type=_positive("--heads", 64), default=2, help="query heads (2)")
    parser.add_argument("--kv-heads", type=_positive("--kv-heads", 64), default=None,
                        help="key/value heads, dividing --heads (as many as --heads)")
    parser.add_argument("--head-dim", type=_positive("--head-dim", 256), default=64, help="(64)")
    parser.add_argument("--block", type=_positive("--block", 4096), default=256,
                        help="the tiled kernel's key block (256)")
    parser.add_argument("--causal", action="store_true", help="mask future keys")
