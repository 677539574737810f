"""Grade a lab from its notebook *file*, with no kernel of the learner's: ``python -m gpumem grade
labs/lab05_offload_budget.ipynb`` (an instructor's grade; :mod:`.lab_fresh` grades in the process that
runs it, and a learner's kernel can change what it shows).

Nothing of the notebook runs here. Its code cells (all but the check cell) are read as text, and
:func:`carried` takes from them what :mod:`.lab_carry` takes from a kernel: each top-level ``def``
and ``class`` statement (the last one of each name, as a kernel run top to bottom keeps), its
imports of installed modules, plain literal assignments (``GB = 10**9``) and second names for a
definition (``checkpoint = MyCheckpoint.apply``). The imports and literals run here too, in a
namespace of their own, so the rules of :mod:`.lab_vet` can look up what a decorator or a default
names; an import of anything but an installed module (a file beside the notebook) is left out, and
named. Then the fresh process grades, exactly as from a kernel.
"""

import ast
import importlib.util
import json
from pathlib import Path

from . import genuine
from .lab_carry import Carried, _blanked, _cut, _names_read, _ordered, _statements
from .lab_vet import _dotted, _literal


def _installed(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return False
    origin = getattr(spec, "origin", None)
    return spec is not None and (origin in ("built-in", "frozen") or (isinstance(origin, str) and genuine.trusted(origin)))


def carried(path: Path, lab: str) -> tuple[Carried, dict]:
    """(what is carried, the namespace its imports and literals make) from the notebook at ``path``."""
    cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
    out, needs, ns = Carried(), {}, {"__name__": "__main__"}
    for n, cell in enumerate(cells):
        source = "".join(cell.get("source", ""))
        if cell.get("cell_type") != "code" or "check_lab" in source:
            continue
        name, lines = f"<{lab}.ipynb cell {n}>", _blanked(source).splitlines(True)
        for node in _statements(source):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                bound = [(a.asname or a.name).split(".")[0] for a in node.names]
                if getattr(node, "level", 0) or not _installed(module or ""):
                    out.left.update(dict.fromkeys(bound, f"an import of {module}, not an installed module"))
                    continue
                line = ast.unparse(node)
                for b in bound:
                    out.values[b] = line
                    out.left.pop(b, None)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                source_of = _cut(lines, node)
                out.defs[node.name] = (name, source_of, node.name)
                needs[node.name] = _names_read(source_of, name)[0] - {node.name}
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and _literal(node.value) and \
                    all(isinstance(t, ast.Name) for t in ast.walk(node.targets[0]) if not isinstance(t, (ast.Tuple, ast.Load, ast.Store))):
                for t in ast.walk(node.targets[0]):                 # GB, GiB = 10**9, 2**30
                    if isinstance(t, ast.Name):
                        out.values[t.id] = ast.unparse(node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target = node.targets[0].id
                if (parts := _dotted(node.value)) is not None and parts[0] in out.defs:
                    out.after[target] = ast.unparse(node)
    read = set().union(*(_names_read(src, f)[1] for f, src, _ in out.defs.values()))
    for kept in (out.values, out.left):                   # what the definitions read, as the kernel's carry
        for unread in [b for b in kept if b not in read]:  # does (review r22: 9 against 3 for lab 02)
            del kept[unread]
    for line in dict.fromkeys(out.values.values()):       # for lab_vet's look-ups only
        try:
            exec(compile(line, "<carried values>", "exec"), ns)
        except Exception as err:                           # noqa: BLE001 -- named; the check grades the rest
            print(f"note: `{line[:60]}` did not run here: {type(err).__name__}: {err}")
    out.defs = _ordered(out.defs, needs)
    return out, ns
