"""``python -m gpumem grade NOTEBOOK``: a lab graded from its file, nothing of the notebook run first
(gpumem.course.lab_file, gpumem.cli_grade)."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from gpumem.course import lab_file, lab_fresh


def _notebook(tmp_path, cells: list[str], name: str = "lab08_finetune_recipe.ipynb"):
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None}
                    for c in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    return path


def test_definitions_imports_and_literals_are_read_from_the_file_and_nothing_else_runs(tmp_path):
    (tmp_path / "mine.py").write_text("raise SystemExit('a module of the learner ran')\n")
    path = _notebook(tmp_path, [
        "%%time\nimport json\nimport math as m\nGB, GiB = 10**9, 2**30\njson.dumps = None  # a cheat at the top\n",
        "import mine\nif True:\n    def role_bytes(x):\n        return m.ceil(x / GB)\n",
        "def role_bytes(x):\n    return m.floor(x / GiB)\n\n\nfirst = role_bytes\n",
        "def mine_too():\n    return mine.VALUE\n",
        "from gpumem.chapters import check_lab\ncheck_lab('lab08_finetune_recipe', globals())\n"])
    carried, ns = lab_file.carried(path, "lab08_finetune_recipe")
    # only what a definition reads travels, as from a kernel (review r22: json and GB are read by none;
    # the first role_bytes, which read GB, was redefined)
    assert set(carried.values) == {"m", "GiB"} and carried.after == {"first": "first = role_bytes"}
    assert list(carried.defs) == ["role_bytes", "mine_too"] and "floor" in carried.defs["role_bytes"][1]
    assert carried.defs["role_bytes"][0] == "<lab08_finetune_recipe.ipynb cell 2>"
    assert carried.left == {"mine": "an import of mine, not an installed module"}
    assert json.dumps is not None and ns["m"].floor(2.5) == 2          # the top-level cheat did not run
    sent = lab_fresh.payload("lab08_finetune_recipe", ns, False, carried)
    fresh = lab_fresh.rebuild(sent)
    assert fresh["first"](3 * 2**30) == 3 and lab_fresh.refusal(sent, ns) is None


def _grade(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpumem", "grade", *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)


def test_the_solution_passes_and_the_blank_lab_does_not():
    done = _grade(ROOT / "solutions" / "lab08_finetune_recipe.ipynb")
    assert done.returncode == 0 and "15/15 checks pass" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    blank = _grade(ROOT / "labs" / "lab08_finetune_recipe.ipynb", "--json")
    got = json.loads(blank.stdout.strip().splitlines()[-1])
    assert blank.returncode == 1 and got["solved"] is False and {r["status"] for r in got["rows"]} == {"todo"}


@pytest.mark.parametrize("args, said", [
    (["no_such.ipynb"], "no notebook file 'no_such.ipynb'"),
    (["README.md"], "no notebook file 'README.md'"),
    (["notebooks/00_setup.ipynb"], "00_setup.ipynb is not a lab notebook; accepted:"),
    (["labs/lab08_finetune_recipe.ipynb", "--seed", "1"], "lab08_finetune_recipe's check draws from no seed"),
])
def test_bad_input_is_one_line_and_exit_2(args, said):
    done = _grade(*args)
    assert done.returncode == 2 and done.stdout == "" and said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_file_carries_what_the_definitions_read_as_a_kernel_does():
    """Review r22 (lab 02): the file path said "9 modules and values", the kernel path 3. By hand,
    lab 02's two functions read math, torch and dist; the sweep cell's imports are read by neither."""
    carried, _ = lab_file.carried(ROOT / "solutions" / "lab02_zero2_hooks.ipynb", "lab02_zero2_hooks")
    assert set(carried.values) == {"math", "torch", "dist"} and carried.left == {}
