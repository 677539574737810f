"""What one operator keeps for its backward, read from autograd itself (the note's per-operator
list in the ledger: ``Q = X W_q``, ``softmax(S)``, the scale of the scores).

:func:`saved_by` runs one small operator under ``torch.autograd.graph.saved_tensors_hooks`` and
names, among the operator's inputs, weight and output, the tensors autograd saved (matched by
storage). :func:`sdpa_scale` reads the factor PyTorch's attention applies to Q Kᵀ by solving a
two-key attention for it. Torch is imported inside the functions, so the ledger's other rows stay
torch-free.
"""

import math

OPS = ("matmul", "scores", "softmax")


def saved_by(op: str) -> list[str]:
    """The named tensors autograd keeps for ``op``'s backward, in the order they are listed:

    ``matmul``: Q = X W_q (names X, W_q, Q); ``scores``: S = Q Kᵀ (Q, K, S);
    ``softmax``: P = softmax(S) (S, P)."""
    import torch
    from gpumem.errors import one_of

    one_of(op, OPS, "operator")
    torch.manual_seed(0)
    if op == "matmul":
        x = torch.randn(2, 8, 16, requires_grad=True)
        w = torch.nn.Parameter(torch.randn(16, 16))
        names, run = {"X": x, "W_q": w}, lambda: x @ w
    elif op == "scores":
        q, k = torch.randn(2, 8, 16, requires_grad=True), torch.randn(2, 8, 16, requires_grad=True)
        names, run = {"Q": q, "K": k}, lambda: q @ k.transpose(-1, -2)
    else:
        s = torch.randn(2, 8, 8, requires_grad=True)
        names, run = {"S": s}, lambda: torch.softmax(s, dim=-1)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.untyped_storage().data_ptr()) or t,
                                                  lambda t: t):
        out = run()
    names[{"matmul": "Q", "scores": "S", "softmax": "P"}[op]] = out
    return [name for name, t in names.items() if t.untyped_storage().data_ptr() in kept]


def sdpa_scale(head_dim: int) -> float:
    """The factor PyTorch's ``scaled_dot_product_attention`` applies to Q Kᵀ by default, measured:
    one query q = e0 against keys t*e0 and 0 with values 1 and 0 gives sigmoid(scale * t)."""
    import torch
    import torch.nn.functional as F

    t = 1.0
    q = torch.zeros(1, 1, 1, head_dim, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 2, head_dim, dtype=torch.float64)
    k[..., 0, 0] = t
    v = torch.tensor([1.0, 0.0], dtype=torch.float64).view(1, 1, 2, 1)
    p = F.scaled_dot_product_attention(q, k, v).item()          # = sigmoid(scale * t)
    return math.log(p / (1 - p)) / t
