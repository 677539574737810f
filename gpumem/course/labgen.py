"""Labs are generated from their solutions (written once, in ``solutions/``).

In a solution notebook, code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is the
answer. The generated lab replaces it with a TODO that raises ``NotImplementedError`` at the
same indentation, and drops every output, the nbval check markers and each line that ends with
``# solutions only`` (the solutions' ``assert report.solved``: nbval, running the solution in a
kernel, then fails where the solution does not pass its own check). ``python -m gpumem.course.labgen`` regenerates ``labs/``;
``--check`` exits 1 when a committed lab is stale (a test runs that).
"""

import re
import sys
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
TODO = 'raise NotImplementedError("TODO: your code here")'
SOLUTION_ONLY = "# solutions only"
_REGION = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*$",
                     re.MULTILINE | re.DOTALL)


def strip_solutions(source: str) -> str:
    """Replace every marked solution region of a code cell's source with a TODO line."""
    if source.count(BEGIN) != source.count(END):
        raise ValueError(f"unbalanced solution markers in:\n{source}")
    return _REGION.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}{TODO}", source)


def lab_from_solution(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The lab notebook made from a solution notebook: solutions replaced by TODOs, outputs dropped."""
    lab = nbformat.from_dict(nb)
    for cell in lab.cells:
        if cell.cell_type != "code":
            continue
        # the lab is not run under nbval (it has no outputs), so its check markers go too
        cell.source = "\n".join(line for line in strip_solutions(cell.source).splitlines()
                                 if line.strip() != "# NBVAL_CHECK_OUTPUT" and not line.rstrip().endswith(SOLUTION_ONLY))
        cell.outputs = []
        cell.execution_count = None
        cell.metadata.pop("execution", None)
        tags = [t for t in cell.metadata.get("tags", []) if not t.startswith("nbval-")]
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
    lab.metadata["gpumem"] = {"generated_from": "solutions/", "edit": "edit the solution, then run python -m gpumem.course.labgen"}
    return lab


def lab_path(solution: Path, labs_dir: Path) -> Path:
    """Where the lab generated from ``solution`` goes: the same file name under ``labs_dir``."""
    return labs_dir / solution.name


def sync(root: Path, check: bool = False) -> list[Path]:
    """Write ``labs/`` from ``solutions/``; with ``check``, only list the stale labs."""
    stale = []
    for solution in sorted((root / "solutions").glob("lab*.ipynb")):
        text = nbformat.writes(lab_from_solution(nbformat.read(solution, as_version=4))) + "\n"
        target = lab_path(solution, root / "labs")
        if not target.exists() or target.read_text() != text:
            stale.append(target)
            if not check:
                target.parent.mkdir(exist_ok=True)
                target.write_text(text)
    return stale


def main(argv: list[str]) -> int:
    """Regenerate ``labs/`` from ``solutions/`` (``--check``: only list stale labs); returns exit status."""
    root = Path(__file__).resolve().parents[2]   # gpumem/course/labgen.py -> the checkout
    check = "--check" in argv
    stale = sync(root, check=check)
    for path in stale:
        print(("stale: " if check else "wrote: ") + str(path.relative_to(root)))
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
