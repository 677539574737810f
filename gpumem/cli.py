"""``python -m gpumem``: the course's command line (a stable, user-facing contract).

Every verb prints a readable table, or with ``--json`` one JSON object. Bad input exits with
status 2 and one line naming the bad value and what is accepted, never a traceback. A failed run
(:class:`gpumem.errors.RunFailure`) prints one line and exits 1; Ctrl-C prints one line and exits
130; output cut short by a closed pipe (``| head -1``) ends quietly with 141, as ``cat`` or ``yes``
killed by SIGPIPE report it (128 + 13), so ``set -o pipefail`` sees the output was not all read;
output that cannot be written (``> /dev/full``) is one line and exit 1.
"""

import argparse
import errno
import json
import os
import re
import signal
import sys

from .errors import RunFailure, UsageError


def _cut_long_values(message: str) -> str:
    """argparse and the library quote a bad value whole: a 5,000-character value would make a
    5,000-character line. Quoted values and digit runs over 80 characters are cut to 60."""
    message = re.sub(r"'([^']{60})[^']{20,}'", lambda m: f"'{m.group(1)}...' (cut)", message)
    return re.sub(r"([0-9]{60})[0-9]{20,}", lambda m: f"{m.group(1)}... (cut)", message)


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus the error; the contract is one line, so raise instead."""

    def error(self, message):
        raise UsageError(_cut_long_values(message))


def _add_verbs(sub, run_options: bool) -> None:
    p = sub.add_parser("check-env", help="what is installed and what works on this machine")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_check_env)
    # Chapter verbs register themselves here as they are built (see gpumem.cli_verbs).
    from . import cli_verbs
    cli_verbs.register(sub, run_options)
    from . import cli_plan
    cli_plan.register(sub)
    from . import cli_grade
    cli_grade.register(sub)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``python -m gpumem`` parser with every verb; bad input raises UsageError instead of exiting.

    An experiment's own options (``run attention --seqs``) live in its chapter, whose package
    imports torch; they are added only when ``argv`` runs an experiment, so ``estimate`` and
    ``plan`` start without torch."""
    parser = _Parser(prog="python -m gpumem",
                     description="Fitting 70B: GPU memory of LLM training, computed.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    _add_verbs(sub, run_options=bool(argv) and argv[0] == "run")
    _state_bounds(parser)
    return parser


def _state_bounds(parser: argparse.ArgumentParser) -> None:
    """Every option whose type has an upper bound (``type.bound``) says it in its help."""
    from .units import MAX_SIZE_TEXT, bound_text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _state_bounds(child)
        elif getattr(action.type, "bound", None) and action.help != argparse.SUPPRESS \
                and f"at most {bound_text(action.type.bound)}" not in (action.help or ""):
            action.help = f"{action.help + '; ' if action.help else ''}at most {bound_text(action.type.bound)}"
        elif "--gpu-mem" in action.option_strings and "at most" not in (action.help or ""):
            action.help = f"{action.help or ''}; at most {MAX_SIZE_TEXT}"


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


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).splitlines()).strip() or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv``); returns the exit status: 0, 1 for a
    failed run, 2 for bad input, 130 for Ctrl-C, 141 when stdout's reader has gone."""
    argv = _join_negative_values(sys.argv[1:] if argv is None else argv)
    args = None
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if args.verb is None:
            parser.print_help()
            status = 0
        else:
            status = args.func(args)
        if sys.stdout is not None:      # None: started with stdout closed (>&-); print wrote nothing
            sys.stdout.flush()          # a closed pipe is found here, not in the interpreter's exit
        return status
    except UsageError as err:
        print(f"gpumem: error: {_cut_long_values(_one_line(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:    # Ctrl-C (the launcher's RunStopped is one too: its line says more)
        print(f"gpumem: {_one_line(err) if isinstance(err, RunFailure) else 'interrupted (Ctrl-C)'}",
              file=sys.stderr)
        signum = getattr(err, "signum", None) or signal.SIGINT
        return 128 + int(signum)
    except RunFailure as err:
        if getattr(args, "verbose", False) and err.detail:
            print(err.detail.rstrip(), file=sys.stderr)
        print(f"gpumem: run failed: {_one_line(err)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise                       # another pipe (a rank's): a real fault, shown whole
        # the reader (head -1) has gone: point stdout at /dev/null so the exit's flush stays quiet
        _stdout_to_devnull()
        return 128 + signal.SIGPIPE
    except OSError as err:
        if err.filename is not None or err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
            raise                       # not the output: a real fault, shown whole
        _stdout_to_devnull()            # `> /dev/full`, a full disk or quota: the output could not be written
        print(f"gpumem: error: cannot write the output: {os.strerror(err.errno)}", file=sys.stderr)
        return 1


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its end)."""
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _stdout_to_devnull() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):       # stdout without a file descriptor (captured in a test)
        pass
