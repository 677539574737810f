"""Lab 02's ranks get the learner's helpers from other cells, and a rank's error names its line
(review r18: a helper in its own cell was "not defined" on the ranks, with no line to look at)."""

import inspect
import linecache
import textwrap
import traceback

from gpumem.chapters.ch02_zero import lab02_bundle

CELLS = [
    "import collections\nimport math as m\nWORLD = 2\nFLOOR = 4\n\n\ndef pad_to(n, world=WORLD):\n"
    "    return -(-n // world) * world\n",
    "def install_zero2_hooks(params, grad_shards, bucket_bytes, floor=FLOOR):\n"
    "    q = collections.deque([m.ceil(0.5)])\n    return pad_to(5) + helper2() + len(q) + floor\n",
    "def helper2():\n    return len(str(SHIFT))\n\n\nSHIFT = 3.5\nTENSOR_LIKE = object()\n",
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
    assert "TENSOR_LIKE" not in sent                                            # never read: not sent
    rank: dict = {}
    exec(compile(sent, lab02_bundle.RANK_FILE, "exec"), rank)
    assert rank["install_zero2_hooks"](None, None, 0) == 6 + 3 + 1 + 4           # as in the notebook
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
    assert lab02_bundle.where(detail, sent) == " (your code on the ranks, line " \
        f"{sent.splitlines().index('    return len(str(SHIFT))') + 1}: `return len(str(SHIFT))`)"
    assert lab02_bundle.where("Traceback ... File \"x.py\", line 3", sent) == ""
