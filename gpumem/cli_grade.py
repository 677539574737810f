"""``python -m gpumem grade NOTEBOOK``: grade a lab from its notebook file, in a fresh process, with no
kernel of the learner's (:mod:`gpumem.course.lab_file`). Exit 0 when every row passes, 1 when one
does not, 2 on bad input."""

import inspect
import json
from pathlib import Path

from .errors import UsageError


def register(sub) -> None:
    """Add the ``grade`` verb to the command line's subparsers."""
    p = sub.add_parser("grade", help="grade a lab notebook file in a fresh process (an instructor's grade)",
                       description="Grade a lab notebook file: its definitions are read as text and graded in "
                                   "a fresh Python process; nothing of the notebook runs before. Exit 0 when "
                                   "every row passes, 1 otherwise.")
    p.add_argument("notebook", help="a lab's .ipynb file (labs/lab05_offload_budget.ipynb, or a copy of it)")
    p.add_argument("--seed", type=int, default=None, help="repeat a draw (labs whose check takes a seed)")
    p.add_argument("--json", action="store_true", help="print one JSON object: lab, solved, rows")
    p.set_defaults(func=_grade)


def _lab_of(path: Path) -> str:
    from .chapters import lab_checks
    labs = lab_checks()
    found = [lab for lab in labs if path.stem == lab or path.stem.startswith(lab + "-")]
    if not found:
        raise UsageError(f"{path.name} is not a lab notebook; accepted: a file named like "
                         f"{', '.join(f'{lab}.ipynb' for lab in labs)} (or <name>-<anything>.ipynb)")
    return found[0]


def _grade(args) -> int:
    path = Path(args.notebook)
    if not path.is_file() or path.suffix != ".ipynb":
        raise UsageError(f"no notebook file {args.notebook!r}: give a lab's .ipynb file")
    lab = _lab_of(path)
    from .chapters import lab_checks
    from .course import lab_file, lab_fresh
    from .course.registry import resolve
    options = {}
    if args.seed is not None:
        if "seed" not in inspect.signature(resolve(lab_checks()[lab])).parameters:
            raise UsageError(f"{lab}'s check draws from no seed; accepted: --seed only for labs 01, 03, 04 and 06")
        options["seed"] = args.seed
    lab_fresh.quiet()                  # the notebook's imports are read here too
    try:
        carried, ns = lab_file.carried(path, lab)
    except (ValueError, OSError) as err:
        raise UsageError(f"{path.name} cannot be read as a notebook: {err}") from None
    report = lab_fresh.grade_apart(lab, ns, show=not args.json, carried=carried, options=options)
    if args.json:
        print(json.dumps({"lab": lab, "solved": report.solved,
                          "rows": [dict(function=r.function, case=r.case, status=r.status, detail=r.detail)
                                   for r in report.rows]}))
    return 0 if report.solved else 1
