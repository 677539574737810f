"""Lab 02's ranks get the learner's helpers from other cells, and a rank's error names its line
(review r18: a helper in its own cell was "not defined" on the ranks, with no line to look at)."""

import inspect
import linecache
import textwrap
import traceback

from gpumem.chapters.ch02_zero import lab02_bundle

CELLS = [
    "import collections\nimport math as m\nfrom math import ceil\nfrom collections import deque as dq\n"
    "import torch\nWORLD = 2\nFLOOR = 4\nSIZES = [1, 2, (3, 'x')]\n\n\ndef pad_to(n, world=WORLD):\n"
    "    return -(-n // world) * world\n",
    "def install_zero2_hooks(params, grad_shards, bucket_bytes, floor=FLOOR):\n"
    "    q = collections.deque([m.ceil(0.5)])\n    return pad_to(5) + helper2() + len(q) + floor + flat()\n",
    "def helper2():\n    return len(str(SHIFT)) + ceil(0.1) + len(dq(SIZES))\n\n\nSHIFT = 3.5\nTENSOR_LIKE = object()\n",
    "@torch.no_grad()\ndef flat():\n    return int(torch.ones(2).sum())\n",
]


def _ns() -> dict:
    ns: dict = {}
    for i, source in enumerate(CELLS):
        name = f"<lab02_zero2_hooks.ipynb cell {i}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), ns)
    return ns


def test_helpers_modules_and_plain_values_travel_with_the_hooks():
    ns = _ns()
    fn = ns["install_zero2_hooks"]
    sent = lab02_bundle.bundle(fn, ns, textwrap.dedent(inspect.getsource(fn)))
    assert "def pad_to(n, world=WORLD):" in sent and "def helper2():" in sent     # a helper's helper too
    assert "import math as m" in sent and "import collections" in sent
    assert "WORLD = 2" in sent and "SHIFT = 3.5" in sent and "FLOOR = 4" in sent  # read by a default only
    assert "SIZES = [1, 2, (3, 'x')]" in sent and "ceil = math.ceil" in sent      # r19: both were left
    assert "dq = collections.deque" in sent and "@torch.no_grad()\ndef flat():" in sent
    assert "TENSOR_LIKE" not in sent                                            # never read: not sent
    rank: dict = {}
    exec(compile(sent, lab02_bundle.RANK_FILE, "exec"), rank)
    assert rank["install_zero2_hooks"](None, None, 0) == 6 + (3 + 1 + 3) + 1 + 4 + 2   # as in the notebook
    assert rank["install_zero2_hooks"](None, None, 0) == fn(None, None, 0)


def test_a_ranks_error_names_the_line_of_the_learners_code():
    ns = _ns()
    ns["SHIFT"] = object()                       # not a plain value: stays behind
    fn = ns["install_zero2_hooks"]
    sent = lab02_bundle.bundle(fn, ns, textwrap.dedent(inspect.getsource(fn)))
    rank: dict = {}
    exec(compile(sent, lab02_bundle.RANK_FILE, "exec"), rank)
    try:
        rank["install_zero2_hooks"](None, None, 0)
    except NameError:
        detail = traceback.format_exc()
    else:
        raise AssertionError("SHIFT was sent although it is not a plain value")
    line = "    return len(str(SHIFT)) + ceil(0.1) + len(dq(SIZES))"
    assert lab02_bundle.where(detail, sent) == " (your code on the ranks, line " \
        f"{sent.splitlines().index(line) + 1}: `{line.strip()}`)"
    assert lab02_bundle.where("Traceback ... File \"x.py\", line 3", sent) == ""
