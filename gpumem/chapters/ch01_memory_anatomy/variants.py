"""Lab 01, part 3: layer variants chapter 01 does not tabulate, and their truth from real tensors.

:class:`VariantBlock` is the course's Llama layer (``gpumem.memory.llama``) with three switches:

- ``norm="hf"``: Hugging Face's eager ``LlamaRMSNorm`` (``llama.HFRMSNorm``, the same operators as
  transformers' ``modeling_llama.py``; transformers is not installed here, the class is copied
  from its source, which upcasts to fp32 and multiplies the weight last); ``norm="gemma"``:
  Gemma's ``GemmaRMSNorm`` (transformers ``modeling_gemma.py``, class ``GemmaRMSNorm``, copied
  operator for operator: the weight enters as ``1 + weight``, in fp32, and the product is cast
  back last, "(x * w).to(float16)", transformers PR 29402). ``gpumem.memory`` counts both
  norms too (``norm_bytes(norm="hf")``; Gemma 2's in ``activation_parts.layer_norm``), so a
  learner who reads its docstrings can take the norm term from there; running a copy of its code
  is refused (:mod:`.labcopies`), and the GeLU MLP with dropout and the biases are not in it;
- ``mlp="gelu-dropout"``: a GeLU MLP (up, GeLU, dropout, down, no biases) with dropout on its
  F-wide hidden activations, where transformers' ``T5DenseActDense`` puts it (wi, act, dropout,
  wo), not on the MLP's output as in Korthikanti et al.'s layer, whose count chapter 01 prints;
  dropout is ``torch.native_dropout``, which ``F.dropout``
  runs on CUDA (on CPU ``F.dropout`` multiplies by a noise tensor of the input's dtype instead, so
  the layer calls the CUDA path directly and CPU and GPU save the same bool mask);
- ``mlp=(op, ...)``, a tuple of names from :data:`OPS` and :data:`MULS`: an MLP of two matrices with those
  elementwise operations, in that order, between them (:class:`ChainMLP`; :func:`apply_op`
  is what each name runs, and the hidden tensor goes back to the input's dtype before the down
  projection). The grader draws the tuple at each check (review r9: a count measured or
  fitted in advance for a fixed list of MLPs cannot cover a chain drawn then; the count must
  come from what each operation saves, its dtype, and which tensors two operations share). With
  one-input operations only, a step's bytes depended on the operation before it alone, and 253
  transitions measured in advance covered every chain (reviews r35, r36); ``mulK`` multiplies by a
  tensor up to three operations back, so a step's bytes depend on what became of that tensor since;
- ``qkv_bias=True``: q, k and v projections with biases (Qwen2's attention).

:func:`measure` runs one forward on real bf16 CPU tensors under saved-tensor hooks (autograd's
C entry points, bound at import) and adds up the distinct storages autograd saves,
less the parameters and the RoPE tables every layer shares: the bytes one layer keeps for
backward. tests/test_lab01_adversarial.py checks it equals the fake-tensor trace's per-layer
difference (``labcheck.traced_layer``) on the plain layer.
"""

import torch
import torch.nn.functional as F
from torch import nn

from gpumem.memory import llama
from gpumem.memory.models import ModelConfig

NORMS = ("fused", "hf", "gemma")
MLPS = ("swiglu", "gelu-dropout")            # and any tuple of OPS (ChainMLP)
OPS = ("gelu", "gelu_tanh", "relu", "square", "silu", "sigmoid", "tanh", "exp", "dropout", "scale",
       "float", "bf16")
# a product with an earlier hidden tensor: "mulK" multiplies the current one by the one K operations
# before it (up's output counts as the first), so what a step keeps depends on more than its neighbour
MULS = ("mul1", "mul2", "mul3")
DROPOUT = 0.1
_truth: dict = {}          # (shape, variant) -> (saved bytes, parameters); plain dict, see labguard
# bound at import, C entry points: a notebook cell that patches torch.autograd.graph.saved_tensors_hooks
# or torch.enable_grad before the check does not reach the measurement (labtruth checks the rest)
_PUSH_HOOKS = torch._C._autograd._push_saved_tensors_default_hooks
_POP_HOOKS = torch._C._autograd._pop_saved_tensors_default_hooks
_SET_GRAD, _GRAD_ON = torch._C._set_grad_enabled, torch._C.is_grad_enabled


def dropout(x, p: float):
    """Dropout in training mode, as CUDA's ``F.dropout`` runs it."""
    return torch.native_dropout(x, p, True)[0]


class GemmaRMSNorm(nn.Module):
    """transformers' ``GemmaRMSNorm`` (``modeling_gemma.py``), the same operators."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


def make_norm(norm: str, dim: int, eps: float) -> nn.Module:
    """Part 3's norm: Gemma's here, the fused and Hugging Face's from ``gpumem.memory.llama``."""
    return GemmaRMSNorm(dim, eps) if norm == "gemma" else llama.make_norm(norm, dim, eps)


class GeluMLP(nn.Module):
    """up, GeLU, dropout on the hidden activations, down."""

    def __init__(self, d_model: int, ffn: int, p: float):
        super().__init__()
        self.up = nn.Linear(d_model, ffn, bias=False)
        self.down = nn.Linear(ffn, d_model, bias=False)
        self.p = p

    def forward(self, x):
        return self.down(dropout(F.gelu(self.up(x)), self.p))


def apply_op(name: str, x, *before):
    """One operation of a chain MLP, by its name (one of ``OPS`` or ``MULS``); ``before``: the
    hidden tensors made before ``x``, oldest first (``ChainMLP.forward`` passes them)."""
    if name in MULS:
        return x * before[-int(name[3:])]
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu(x)
    if name == "square":
        return torch.square(x)
    if name == "silu":
        return F.silu(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "tanh":
        return torch.tanh(x)
    if name == "exp":
        return torch.exp(x)
    if name == "dropout":
        return dropout(x, DROPOUT)
    if name == "scale":
        return x * 0.5
    if name == "float":
        return x.float()
    if name == "bf16":
        return x.to(torch.bfloat16)
    raise ValueError(f"unknown op {name!r}: one of {OPS + MULS}")


class ChainMLP(nn.Module):
    """up, the chain's operations in order, back to the input's dtype, down."""

    def __init__(self, d_model: int, ffn: int, ops: tuple):
        super().__init__()
        self.up = nn.Linear(d_model, ffn, bias=False)
        self.down = nn.Linear(ffn, d_model, bias=False)
        self.ops = tuple(ops)

    def forward(self, x):
        hs = [self.up(x)]                         # every hidden tensor, in the order made
        for name in self.ops:
            hs.append(apply_op(name, hs[-1], *hs[:-1]))
        return self.down(hs[-1].type_as(x))


def make_mlp(mlp, d_model: int, ffn: int, cfg: ModelConfig) -> nn.Module:
    """Part 3's MLP: part 2's SwiGLU, the GeLU MLP with dropout, or a chain (a tuple of OPS)."""
    if mlp == "swiglu":
        return llama.MLP(cfg)
    if mlp == "gelu-dropout":
        return GeluMLP(d_model, ffn, DROPOUT)
    if isinstance(mlp, tuple) and all(chain_op_ok(op, i) for i, op in enumerate(mlp)):
        return ChainMLP(d_model, ffn, mlp)
    raise ValueError(f"mlp must be one of {MLPS} or a tuple of {OPS + MULS} (mulK from the K+1-th "
                     f"operation on), not {mlp!r}")


def chain_op_ok(op, i: int) -> bool:
    """Whether ``op`` may be a chain's operation ``i`` (from 0): "mulK" needs K tensors before x."""
    return op in OPS or (op in MULS and int(op[3:]) <= i)


class VariantBlock(nn.Module):
    """The course's Llama layer with part 3's three switches."""

    def __init__(self, cfg: ModelConfig, norm: str = "fused", mlp="swiglu",
                 qkv_bias: bool = False):
        super().__init__()
        self.attn_norm = make_norm(norm, cfg.d_model, cfg.norm_eps)
        self.attn = llama.Attention(cfg)
        if qkv_bias:
            self.attn.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=True)
            self.attn.wk = nn.Linear(cfg.d_model, cfg.kv_dim, bias=True)
            self.attn.wv = nn.Linear(cfg.d_model, cfg.kv_dim, bias=True)
        self.mlp_norm = make_norm(norm, cfg.d_model, cfg.norm_eps)
        self.mlp = make_mlp(mlp, cfg.d_model, cfg.ffn, cfg)

    def forward(self, x, cos, sin, kernel: str):
        h = x + self.attn(self.attn_norm(x), cos, sin, kernel)
        return h + self.mlp(self.mlp_norm(h))


def without_comments(source: str) -> str:
    """``source`` with its comments and blank lines removed (they would name what is saved)."""
    import io
    import tokenize
    drop = {(t.start[0], t.start[1]) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT}
    lines = source.splitlines()
    for row, col in drop:
        lines[row - 1] = lines[row - 1][:col].rstrip()
    return "\n".join(line for line in lines if line.strip())


def variant_source() -> str:
    """What part 3 prints: the variant block and the pieces part 2 did not show."""
    import inspect
    import textwrap
    parts = [("VariantBlock", VariantBlock), ("make_norm", make_norm), ("make_mlp", make_mlp), ("chain_op_ok", chain_op_ok),
             ("HFRMSNorm (norm='hf')", llama.HFRMSNorm.forward), ("GemmaRMSNorm (norm='gemma')", GemmaRMSNorm),
             ("GeluMLP (mlp='gelu-dropout')", GeluMLP), ("dropout", dropout),
             ("ChainMLP (mlp=a tuple of op names)", ChainMLP), ("apply_op", apply_op)]
    return "\n\n".join(f"# {title}\n" + without_comments(textwrap.dedent(inspect.getsource(obj)))
                       for title, obj in parts)


def config(d_model: int, n_heads: int, n_kv_heads: int, ffn: int) -> ModelConfig:
    """A one-layer configuration of these widths (the vocabulary is unused)."""
    return ModelConfig("lab01-variant", 1, d_model, n_heads, n_kv_heads, ffn, 16)


def measure(d_model: int, n_heads: int, n_kv_heads: int, ffn: int, seq: int, batch: int, kernel: str,
            norm: str, mlp, qkv_bias: bool) -> tuple[int, int]:
    """(bytes one layer saves for backward, the layer's parameters), from one real forward."""
    mlp = tuple(mlp) if isinstance(mlp, (tuple, list)) else mlp
    key = (d_model, n_heads, n_kv_heads, ffn, seq, batch, kernel, norm, mlp, bool(qkv_bias))
    if key in _truth:
        return _truth[key]
    cfg = config(d_model, n_heads, n_kv_heads, ffn)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        block = VariantBlock(cfg, norm, mlp, bool(qkv_bias)).to(torch.bfloat16)
        cos, sin = llama.rope_tables(seq, cfg.head_dim, cfg.rope_theta, torch.bfloat16)
        x0 = torch.randn(batch, seq, d_model, dtype=torch.bfloat16, requires_grad=True)
        seen: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
            return t
        recording = _GRAD_ON()
        _SET_GRAD(True)
        _PUSH_HOOKS(pack, lambda t: t)
        try:
            out = block(x0 * 1, cos, sin, kernel)       # x0 * 1: the input is freed unless saved
        finally:
            _POP_HOOKS()
            _SET_GRAD(recording)
        del out
    for t in [*block.parameters(), cos, sin]:
        seen.pop(t.untyped_storage().data_ptr(), None)
    _truth[key] = (sum(seen.values()), sum(p.numel() for p in block.parameters()))
    return _truth[key]
