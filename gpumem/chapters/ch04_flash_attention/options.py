"""``python -m gpumem run attention``'s own options (torch-free: imported when the command line is built).

``--seqs`` takes a comma-separated list of sequence lengths (4k = 4096); the attention shape is
``--heads``, ``--kv-heads`` (GQA when fewer), ``--head-dim``; ``--block`` is the tiled kernel's
key block and ``--causal`` masks future keys. Bad values raise ``UsageError`` (exit status 2).
"""

import argparse
import re

MAX_SEQ = 16384        # naive fp32 scores at 16k are 1 GiB a head: the most a laptop should try
MAX_SEQS = 16          # lengths in one --seqs list: each is a sweep of every method
DEFAULT_SEQS = (256, 512, 1024, 2048, 4096, 8192)


def _shown(text: str) -> str:
    r = repr(text)
    return r if len(r) <= 40 else f"{r[:39]}...' ({len(text):,} characters)"


def seq_list(text: str) -> tuple[int, ...]:
    """``"256,1024,8k"`` -> (256, 1024, 8192): up to 16 positive lengths up to 16384, k = 1024."""
    out = []
    parts = str(text).split(",")
    for part in parts:
        m = re.fullmatch(r"\s*([0-9]{1,6})\s*([kK]?)\s*", part)     # 6 digits: int() stays small
        value = int(m.group(1)) * (1024 if m.group(2) else 1) if m else 0
        if not 0 < value <= MAX_SEQ or len(parts) > MAX_SEQS:
            raise argparse.ArgumentTypeError(f"--seqs must be 1 to {MAX_SEQS} comma-separated lengths from 1 to "
                                             f"{MAX_SEQ} such as 256,1024,4k, got {_shown(text)}")
        out.append(value)
    return tuple(out)


seq_list.bound = MAX_SEQ     # gpumem.cli states it in the help


def _positive(name: str, most: int):
    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*[0-9]{1,9}\s*", text) or not 0 < int(text) <= most:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number from 1 to {most}, got {_shown(text)}")
        return int(text)
    parse.bound = most
    return parse


SCORES_MOST = 2 * MAX_SEQ**2 * 4   # bytes of the naive fp32 scores: 2 heads at 16k, 2 GiB


def check(args) -> None:
    """Across options, before torch loads: --kv-heads divides --heads, and on CPU the naive
    method's fp32 scores (heads x seq^2 x 4 bytes) stay within :data:`SCORES_MOST`, so 64 heads
    at 16k (64 GiB) is refused before anything is allocated."""
    from gpumem.errors import UsageError
    if args.kv_heads and args.heads % args.kv_heads:      # the experiment's own rule, before torch loads
        raise UsageError(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}; "
                         f"accepted: a divisor of {args.heads}")
    scores = args.heads * max(args.seqs) ** 2 * 4
    if args.device == "cpu" and scores > SCORES_MOST:
        raise UsageError(f"--heads {args.heads} at --seqs {max(args.seqs)} needs {scores / 2**30:,.0f} GiB of "
                         f"naive attention scores; accepted on CPU: heads x seq^2 x 4 bytes at most 2 GiB")


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
    parser.set_defaults(_check_options=check)
