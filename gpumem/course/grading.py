"""Grading for labs: a lab's ``check()`` builds a :class:`Report` of rows ``ok``, ``todo`` (still
raises ``NotImplementedError``), ``wrong`` (expected vs got) or ``error`` (what it raised, or "took
longer than N s"). It never raises: each case runs through :func:`run_case`, the learner's call
*and* the grader's comparison under one guard and time limit; only Ctrl-C passes."""

import contextlib
import io
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Callable

from .case_limits import TookTooLong, case_seconds, time_limit  # noqa: F401 (labchecks import them here)
from .lab_bare import CARRIED

OUTPUT_CHARS = 20_000      # what one case may print (stdout and stderr each); the rest is counted
DETAIL_CHARS = 300         # a row's detail is one line at most this long


def _sealable():
    """A metaclass whose classes refuse new attributes once :func:`freeze` ran, and ``freeze`` (the
    fresh grading process calls it before any learner code: review r18 of lab 03 swapped
    ``Report.summary`` through ``next(iter([Report]))``, which no rule on names sees)."""
    frozen: list = []

    class Sealed(type):
        def __setattr__(cls, name, value):
            if frozen:
                raise TypeError(f"{cls.__name__}.{name} is the grader's: graded code does not change it")
            super().__setattr__(name, value)

        def __delattr__(cls, name):
            if frozen:
                raise TypeError(f"{cls.__name__}.{name} is the grader's: graded code does not change it")
            super().__delattr__(name)

    def freeze() -> None:
        frozen.append(True)

    def is_frozen() -> bool:
        return bool(frozen)
    return Sealed, freeze, is_frozen


_Sealed, freeze, _frozen = _sealable()


@dataclass
class Row(metaclass=_Sealed):
    """One graded case: the function, the case, its status and what went wrong. Once made, only
    gpumem's own code changes it where the grading process was frozen (:func:`freeze`)."""
    function: str
    case: str
    status: str   # ok | todo | wrong | error
    detail: str = ""

    def __setattr__(self, name, value):
        if _frozen() and "detail" in self.__dict__:
            code = sys._getframe(1).f_code
            from .genuine import _OWN, genuine
            if not (code.co_filename.startswith(_OWN) and genuine(code)):
                raise AttributeError(f"a graded row's {name} is the grader's: graded code does not change it")
        object.__setattr__(self, name, value)


@dataclass
class Report(metaclass=_Sealed):
    """A lab's graded rows and their summary; the lab is solved once every row is ok."""
    lab: str
    rows: list[Row] = field(default_factory=list)
    stopped: dict = field(default_factory=dict)   # function -> why its later cases are not run

    @property
    def solved(self) -> bool:
        return bool(self.rows) and all(r.status == "ok" for r in self.rows)

    @property
    def todo(self) -> list[str]:
        """Functions not written yet, in the order the lab asks for them."""
        return list(dict.fromkeys(r.function for r in self.rows if r.status == "todo"))

    @property
    def problems(self) -> list[Row]:
        return [r for r in self.rows if r.status in ("wrong", "error")]

    def summary(self) -> str:
        lines = [f"{self.lab}: {sum(r.status == 'ok' for r in self.rows)}/{len(self.rows)} checks pass"]
        if self.todo:
            lines.append("still to do: " + ", ".join(self.todo))
        for r in self.problems:
            lines.append(f"  {r.status.upper()} {r.function} [{r.case}]: {r.detail}")
        if self.solved:
            lines.append("all correct — well done.")
        return "\n".join(lines)

    __str__ = summary

    def _repr_pretty_(self, printer, cycle):  # IPython display
        printer.text(self.summary())


class Todo(Exception):
    """The learner's function still raises ``NotImplementedError``."""


class LearnerError(Exception):
    """The learner's function raised: ``str()`` is the exception's type and first line."""


class _Capped(io.TextIOBase):
    """A stream that passes on the first ``limit`` characters and counts the rest."""
    def __init__(self, target, limit: int):
        self.target, self.limit, self.written = target, limit, 0

    def write(self, s: str) -> int:
        if self.written < self.limit:
            self.target.write(s[:self.limit - self.written])
        self.written += len(s)
        return len(s)

    def flush(self):
        self.target.flush()


@contextlib.contextmanager
def capped_output(limit: int = OUTPUT_CHARS):
    """Let what the learner's code prints through, up to ``limit`` characters per stream."""
    out, err = _Capped(sys.stdout, limit), _Capped(sys.stderr, limit)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        for stream in (out, err):
            if stream.written > limit:
                stream.target.write(f"\n[... {stream.written - limit:,} more characters printed, not shown]\n")


def one_line(text: str, limit: int = DETAIL_CHARS) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def error_line(err: BaseException) -> str:
    """An exception as one line: its type and first line; a pydantic error as each field's path,
    complaint and input."""
    if type(err).__name__ == "ValidationError" and callable(errors := getattr(err, "errors", None)):
        with contextlib.suppress(Exception):
            return one_line("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}, got {e.get('input')!r}"
                                      for e in errors()))
    return one_line(f"{type(err).__name__}: {err}" if str(err) else f"{type(err).__name__} (no message)")


def kind(value: Any) -> str:
    """What a value is, in words a learner reads: 'None', 'a numpy.ndarray of shape (3,)',
    'a torch.Tensor of shape (2, 4) on meta', "a str ('zero3')", 'a dict with keys a, b'."""
    if value is None:
        return "None"
    t = type(value)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__.split('.')[0]}.{t.__name__}"
    article = "an" if name[0].lower() in "aeiou" else "a"
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, type):
        where = getattr(value, "device", None) if name.startswith("torch.") else None
        return f"{article} {name} of shape {tuple(shape)}" + (f" on {where}" if where is not None else "")
    more = (f" ({one_line(repr(value), 60)})" if isinstance(value, (str, int, float)) else
            " with keys " + one_line(", ".join(map(str, value)) or "(none)", 120) if isinstance(value, dict) else
            f" of {len(value)} item(s)" if isinstance(value, (list, tuple)) else "")
    return f"{article} {name}{more}"


def returned(value: Any, expected: str) -> str:
    """'returned X, expected Y' in the learner's terms; None asks about a forgotten return."""
    return ("returned None -- did you forget `return`?" if value is None
            else f"returned {kind(value)}, expected {expected}")


def _own_raise(err: BaseException) -> bool:
    """The error's last Python frame is a ``raise`` line outside installed code and the course's own
    (review r35 of lab 04: a sparse op refused under the grader's watch read "still raises
    NotImplementedError", as if the function were not written)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return True
    name = tb.tb_frame.f_code.co_filename
    installed = [os.path.dirname(os.path.dirname(__file__)), *sysconfig.get_paths().values()]
    if any(name.startswith(p + os.sep) for p in installed if p):
        return False
    text = CARRIED.get(name)         # the grading process's cells: linecache holds empty lines (lab_bare.masked)
    lines = text.splitlines() if text is not None else None
    line = lines[tb.tb_lineno - 1] if lines and 0 < tb.tb_lineno <= len(lines) else linecache.getline(name, tb.tb_lineno)
    return line.lstrip().startswith("raise")


def call(fn: Callable, *args, **kwargs):
    """Call the learner's ``fn``: ``NotImplementedError`` becomes :class:`Todo`, any other exception
    (``sys.exit`` too; only Ctrl-C passes) :class:`LearnerError`; its printing is capped."""
    if not callable(fn):
        raise LearnerError(f"it is {kind(fn)}, not a function")
    torch = sys.modules.get("torch")
    state = torch._C._get_torch_function_state() if torch is not None else None
    try:
        with capped_output():
            result = fn(*args, **kwargs)
    except NotImplementedError as err:
        if _own_raise(err):
            raise Todo() from None
        raise LearnerError(f"an op inside your call raised NotImplementedError (not your function's own raise: "
                           f"an op this lab's grader or torch does not support here): {error_line(err)}") from None
    except BaseException as err:
        if isinstance(err, (KeyboardInterrupt, TookTooLong)):
            raise
        raise LearnerError(f"it called sys.exit({err.code!r}); return the answer instead"
                           if isinstance(err, SystemExit) else error_line(err)) from None
    finally:
        if state is not None and torch._C._get_torch_function_state() != state:
            torch._C._set_torch_function_state(state)   # r20: left switched off, it blinded later checks
            left_off = True
        else:
            left_off = False
    if left_off:
        raise LearnerError("it left torch's __torch_function__ switched off (DisableTorchFunction entered, never "
                           "left): the grader's watches would see nothing after it")
    return result


def run_case(report: Report, function: str, case: str, body: Callable[[], tuple[str, str] | None],
             seconds: float | None = None, on_crash: Callable[[Exception], str] | None = None,
             limit: int = DETAIL_CHARS) -> Row:
    """Add the row of one case: ``body()`` calls the learner through :func:`call` and returns
    ``(status, detail)`` (or adds its own rows and returns None). Nothing escapes: the learner's
    exception, or the case's time limit, gives an ``error`` row; a check the learner's value broke
    (a compare raising on a numpy array) a ``wrong`` row ``on_crash(err)``, replacing the body's.
    ``limit``: the detail's characters (a lab whose rows name a long setup and a hint asks more)."""
    start = len(report.rows)
    if function in report.stopped:                # one hang costs one time limit, not one per case
        report.rows.append(Row(function, case, "error", report.stopped[function]))
        return report.rows[-1]
    try:
        with time_limit(case_seconds(seconds)):
            result = body()
        if result is None:
            return report.rows[-1]
        status, detail = result
    except Todo:
        status, detail = "todo", f"{function} still raises NotImplementedError"
    except (LearnerError, TookTooLong) as err:
        status, detail = "error", str(err)
        if isinstance(err, TookTooLong):
            report.stopped[function] = f"not run: an earlier case {err}"
    except Exception as err:  # the learner's value broke the check
        status, detail = "wrong", f"could not be checked: {error_line(err)}"
        with contextlib.suppress(Exception):
            detail = on_crash(err) if on_crash else detail
    del report.rows[start:]
    report.rows.append(Row(function, case, status, one_line(detail or "", limit) if status != "ok" else detail or ""))
    return report.rows[-1]


def failure_line(err: Exception) -> str:
    """A failed rank run in one line: DeepSpeed's refusal of a config field (pydantic's field and
    complaint) where that was the cause, else the run's own last line."""
    import re
    text = f"{err}\n{getattr(err, 'detail', '')}"
    found = re.search(r"validation errors? for \w+\n(\S[^\n]*)\n\s+([^\n]+?)(?: \[type=|\n|$)", text)
    if found:
        return one_line(f"DeepSpeed refused the config: {found.group(1)}: {found.group(2)}")
    return one_line(([s for s in str(err).splitlines() if s.strip()] or [type(err).__name__])[-1])


def grade(report: Report, name: str, fn: Callable | None, cases: list[tuple[str, dict, Any]],
          compare: Callable[[Any, Any], bool] | None = None, show: Callable[[Any], str] = repr,
          seconds: float | None = None) -> None:
    """Run ``fn(**kwargs)`` for each ``(case, kwargs, expected)`` and add a row per case, the
    call, the compare and ``show`` all under :func:`run_case`'s guard and time limit."""
    import copy
    compare = compare or (lambda got, want: got == want)
    for case, kwargs, expected in cases:
        if fn is None:
            report.rows.append(Row(name, case, "todo", f"define {name}"))
            continue
        box: dict = {}

        def body(kwargs=kwargs, expected=expected):
            got = box["got"] = call(fn, **copy.deepcopy(kwargs))   # mutating its inputs changes no case
            if got is None and expected is not None:
                return "wrong", returned(None, "")
            if bool(compare(got, expected)):
                return "ok", ""
            return "wrong", one_line(f"expected {show(expected)}, got {one_line(show(got), 150)}")
        run_case(report, name, case, body, seconds,
                 on_crash=lambda err: returned(box.get("got"), kind(expected)))
