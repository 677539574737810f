"""``python -m gpumem``: the course's command line (a stable, user-facing contract).

Every verb prints a readable table, or with ``--json`` one JSON object. Bad input exits with
status 2 and one line naming the bad value and what is accepted, never a traceback.
"""

import argparse
import json
import re
import sys

from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus the error; the contract is one line, so raise instead."""

    def error(self, message):
        raise UsageError(message)


def _add_verbs(sub, run_options: bool) -> None:
    p = sub.add_parser("check-env", help="what is installed and what works on this machine")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_check_env)
    # Chapter verbs register themselves here as they are built (see gpumem.cli_verbs).
    from . import cli_verbs
    cli_verbs.register(sub, run_options)
    from . import cli_plan
    cli_plan.register(sub)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``python -m gpumem`` parser with every verb; bad input raises UsageError instead of exiting.

    An experiment's own options (``run attention --seqs``) live in its chapter, whose package
    imports torch; they are added only when ``argv`` runs an experiment, so ``estimate`` and
    ``plan`` start without torch."""
    parser = _Parser(prog="python -m gpumem",
                     description="Fitting 70B: GPU memory of LLM training, computed.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    _add_verbs(sub, run_options=bool(argv) and argv[0] == "run")
    return parser


def _check_env(args) -> int:
    from .course import envcheck
    if args.json:
        print(json.dumps(envcheck.as_json()))
    else:
        print(envcheck.report())
    return 0


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--params -70B`` reaches the option's own check (argparse would call -70B an option)."""
    out: list[str] = []
    for tok in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.fullmatch(r"-\d[\w.]*", tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv``); returns the exit status, 2 for bad input."""
    argv = _join_negative_values(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if args.verb is None:
            parser.print_help()
            return 0
        return args.func(args)
    except UsageError as err:
        print(f"gpumem: error: {err}", file=sys.stderr)
        return 2
