"""How a rank's result comes back to the launcher (:func:`gpumem.runs.launch.run`): pickled, or with
``results="plain"`` saved by ``torch.save`` and read by torch's ``weights_only`` loader, so that a rank
that ran a learner's code cannot hand back an object whose unpickling runs code in the grader's
process (review r17 of lab 02)."""

import io
import pickle
import re

from ..errors import RunFailure


class NotPlain(RunFailure):
    """A rank's result held something other than tensors and plain values."""


def dump(result, results: str) -> bytes:
    """The bytes a rank writes for ``result`` (``results``: "any" or "plain", as :func:`load` reads)."""
    if results != "plain":
        return pickle.dumps(result)
    import torch
    buf = io.BytesIO()
    torch.save(result, buf)
    return buf.getvalue()


def load(data: bytes, results: str):
    """A rank's result. ``results="plain"``: tensors and plain values only, read with torch's
    ``weights_only`` loader, since a rank that ran a learner's code could hand back an object whose
    unpickling runs code here (review r17 of lab 02: a tensor subclass reduced to ``cProfile.run``)."""
    if results != "plain":
        return pickle.loads(data)
    import torch
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:                     # noqa: BLE001 -- any refusal: the result is not plain
        named = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = named.group(1) if named else type(err).__name__
        raise NotPlain(f"a rank handed back an object other than tensors and plain values ({what})") from None
