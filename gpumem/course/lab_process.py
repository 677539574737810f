"""The kernel-wide scan's process rule (:mod:`gpumem.course.lab_history`): a cell that starts a process.

Review r13 passed labs 03 and 05 with a helper started from a cell, detached, with an environment of
its own, that answered the grader through a pipe; review r15 started it as ``getattr(os, "system")``.
No lab needs a process of the learner's own (the labs' runs start from gpumem's functions), so
:func:`starts_process` refuses the modules and functions that start one, under their names and by
name through ``getattr``, shell lines (``!cmd``) and shell or interpreter magics (``%%bash``), except
a look at the machine (``!nvidia-smi``, ``!grep ...``: one command of :data:`LOOKING`, no shell syntax).
A list of spellings raises the bar; it proves nothing.
"""

import ast

from gpumem.course import lab_reach

# Starting a process from a cell (review r13 of labs 03 and 05: a helper double-forked with an
# environment of its own, started before the first check, answered the grader through a pipe). No
# lab needs one: the labs' runs (ranks, DeepSpeed) are started by gpumem's own functions.
PROCESS_MODULES = ("subprocess", "multiprocessing", "pty", "torch.multiprocessing", "pexpect", "sh", "plumbum",
                   # review r15 of lab 05: modules that start one by other names
                   "webbrowser", "_posixsubprocess", "torch.utils.cpp_extension", "torch.distributed.run",
                   "torch.distributed.launch", "torch.distributed.launcher", "torch.distributed.elastic",
                   "jupyter_client", "deepspeed.launcher", "os.posix_spawn",
                   # review r16: pip's and the venv's own installers, and gpumem's launcher called from a
                   # cell (a helper on ranks of its own answered lab 05 over a socket)
                   "pip", "ensurepip", "venv", "gpumem.runs.launch")
PROCESS_ATTRIBUTES = ("fork", "forkpty", "system", "popen", "Popen", "posix_spawn", "posix_spawnp", "startfile",
                      "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
                      "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
                      "getoutput", "getstatusoutput", "system_raw", "system_piped", "create_subprocess_exec",
                      "subprocess_exec", "subprocess_shell", "fork_exec", "load_inline",
                      # the standard library's private ways (review r15 of lab 03: uuid's, with env -i)
                      "_get_command_stdout", "_syscmd_ver", "_syscmd_file", "_syscmd_uname", "_popen",
                      "create_subprocess_shell", "ProcessPoolExecutor", "start_processes", "spawn", "Process")
# Shell lines a learner types to look at the machine (``!nvidia-smi``): one command of these, no
# shell syntax (``&``, ``;``, pipes, redirections, substitutions), ends before the cell does
LOOKING = ("nvidia-smi", "rocm-smi", "nvcc", "nproc", "free", "df", "du", "ls", "pwd", "cat", "head", "tail", "wc",
           "lscpu", "uname", "which", "echo", "hostname", "date", "whoami", "id", "grep", "file", "stat")
_SHELL_SYNTAX = set("&;|<>`$(){}\n")
SHELL_MAGICS = ("system", "sx", "bash", "sh", "script", "python", "python2", "python3", "pypy", "perl", "ruby",
                "alias", "pip", "conda", "mamba", "uv",
                "js", "javascript", "killbgscripts")


def starts_process(source: str) -> str | None:
    """A cell that starts a process: a module or function that does, a shell line (``!cmd``) or a
    shell or interpreter magic (``%%bash``, ``%%script``, ``%sx``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found, looking = [], {id(node.func) for node in ast.walk(tree) if _looks(node)}
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if id(node) in looking:
            continue
        if isinstance(node, ast.Import):
            bad = next((a.name for a in node.names if _process_module(a.name)), None)
            if bad:
                found.append((line, f"imports {bad}"))
        elif isinstance(node, ast.ImportFrom):
            bad = next((a.name for a in node.names if a.name in PROCESS_ATTRIBUTES
                        or _process_module(f"{node.module}.{a.name}")), None)
            threads = node.module == "multiprocessing" and [a.name for a in node.names] == ["dummy"]
            if (_process_module(node.module or "") and not threads) or bad:
                found.append((line, f"imports {bad or node.module} from {node.module}"))
        elif (isinstance(node, ast.Attribute) and node.attr in PROCESS_ATTRIBUTES
              and not (node.attr == "system" and isinstance(node.value, ast.Name) and node.value.id == "platform")):
            found.append((line, f"uses .{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in lab_reach.BY_NAME
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and (node.args[1].value in PROCESS_ATTRIBUTES or _process_module(str(node.args[1].value)))):
            found.append((line, f"uses {node.args[1].value!r} by name"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("run_line_magic", "run_cell_magic") and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value in SHELL_MAGICS
              and not _looking_magic(node)):
            found.append((line, f"runs the %{node.args[0].value} magic"))
    if not found:
        return None
    line, what = min(found)
    return (f"line {line}: {what}, which starts a process; no lab needs one (its runs start from "
            "gpumem's functions), and a process of yours could answer for your code")


def _looks(node: ast.AST) -> bool:
    """``!cmd`` (``get_ipython().system('cmd')``) with one command of :data:`LOOKING` and no shell
    syntax: a look at the machine, not a process that outlives the cell."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "system"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return False
    return _looking_command(node.args[0].value)


def _looking_command(command: str) -> bool:
    words = command.split()
    if not words or _SHELL_SYNTAX & set(command.strip()):
        return False
    if words[0] in ("pip", "pip3"):                  # pip list / show / freeze look; install runs code
        return len(words) > 1 and words[1] in ("list", "show", "freeze", "--version")
    return words[0] in LOOKING


def _looking_magic(node: ast.Call) -> bool:
    """``%system ls``, ``%%bash`` with a body of :data:`LOOKING` lines only."""
    magic = node.args[0].value
    text = node.args[-1] if len(node.args) > 1 else None
    if magic in ("pip", "conda", "mamba", "uv"):       # %pip list / show / freeze look; install runs code
        words = text.value.split() if isinstance(text, ast.Constant) and isinstance(text.value, str) else []
        return bool(words) and words[0] in ("list", "show", "freeze", "--version") and not (_SHELL_SYNTAX & set(text.value))
    if magic not in ("system", "sx", "bash", "sh") or not (isinstance(text, ast.Constant) and isinstance(text.value, str)):
        return False
    lines = [ln for ln in text.value.splitlines() if ln.strip()]
    return bool(lines) and all(_looking_command(ln) for ln in lines)


def _process_module(name: str) -> bool:
    if name == "multiprocessing.dummy" or name.startswith("multiprocessing.dummy."):
        return False              # a pool of threads under multiprocessing's API (review r15 of lab 05)
    return any(name == m or name.startswith(m + ".") for m in PROCESS_MODULES)
