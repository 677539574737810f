"""Which dtype and attention kernel a notebook's GPU branch uses, decided from the GPU it finds.

The chapters are written for A100/H100-class GPUs (bf16 tensor cores, FlashAttention-2 through
PyTorch's scaled_dot_product_attention). Colab's free GPU is a Tesla T4 (compute capability 7.5,
16 GB): it has fp16 tensor cores but none for bf16, and PyTorch's flash kernel needs
capability 8.0 or later. On a T4 the GPU branches therefore run fp16 with a loss scaler and
SDPA's memory-efficient kernel, and say so. :func:`choose` decides from a capability (so it is
tested on every GPU generation without owning one); :func:`detect` asks torch about this machine.

Imports no torch at module level: :func:`detect` and :func:`sdpa_kernel` import it when called.
"""

from dataclasses import dataclass

# The compute capability each feature needs (NVIDIA's architecture whitepapers; PyTorch's SDPA
# flash kernel: sm80+ since FlashAttention-2; its memory-efficient kernel: sm50+).
BF16_TENSOR_CORES = (8, 0)     # Ampere
FP16_TENSOR_CORES = (7, 0)     # Volta
FLASH_SDPA = (8, 0)
EFFICIENT_SDPA = (5, 0)


@dataclass(frozen=True)
class Choice:
    """What a GPU branch uses: ``dtype`` ("bfloat16", "float16", "float32"), ``sdpa`` (a member
    name of ``torch.nn.attention.SDPBackend``), whether fp16 needs a loss scaler, and why."""
    device: str
    gpu: str
    capability: tuple[int, int] | None
    dtype: str
    sdpa: str
    loss_scaling: bool
    reasons: tuple[str, ...]

    def describe(self, width: int = 100) -> str:
        """For a notebook: the GPU, the choice, and the reason, wrapped at ``width`` columns."""
        import textwrap
        if self.device == "cpu":
            text = "no CUDA device: CPU path (" + "; ".join(self.reasons) + ")"
        else:
            sm = f"sm_{self.capability[0]}{self.capability[1]}"
            scaler = " with a loss scaler" if self.loss_scaling else ""
            text = (f"{self.gpu} ({sm}): {self.dtype}{scaler}, SDPA kernel {self.sdpa}"
                    + (" (" + "; ".join(self.reasons) + ")" if self.reasons else ""))
        return textwrap.fill(text, width, subsequent_indent="  ", break_long_words=False)


def choose(capability: tuple[int, int] | None, gpu: str = "") -> Choice:
    """The dtype and SDPA kernel for a GPU of compute ``capability`` (``None``: no CUDA)."""
    if capability is None:
        return Choice("cpu", "none", None, "float32", "MATH", False,
                      ("no GPU dtype or attention kernel to choose; the CPU experiments keep their own",))
    cap = tuple(capability)
    reasons = []
    if cap >= BF16_TENSOR_CORES:
        dtype, scaling = "bfloat16", False
    elif cap >= FP16_TENSOR_CORES:
        dtype, scaling = "float16", True
        reasons.append("no bf16 tensor cores before sm_80, so fp16 with loss scaling")
    else:
        dtype, scaling = "float32", False
        reasons.append("no tensor cores before sm_70, so fp32")
    if cap >= FLASH_SDPA:
        sdpa = "FLASH_ATTENTION"
    elif cap >= EFFICIENT_SDPA:
        sdpa = "EFFICIENT_ATTENTION"
        reasons.append("no FlashAttention-2 before sm_80, so the memory-efficient kernel "
                       "(also O(seq) memory, slower)")
    else:
        sdpa = "MATH"
        reasons.append("no fused attention kernel before sm_50, so the math kernel (O(seq^2) memory)")
    return Choice("cuda", gpu or f"GPU sm_{cap[0]}{cap[1]}", cap, dtype, sdpa, scaling, tuple(reasons))


def detect(index: int = 0) -> Choice:
    """:func:`choose` for this machine's GPU ``index`` (or the CPU choice without CUDA)."""
    import torch
    if not torch.cuda.is_available():
        return choose(None)
    return choose(tuple(torch.cuda.get_device_capability(index)), torch.cuda.get_device_name(index))


def torch_dtype(choice: Choice):
    """The ``torch.dtype`` of a choice (``torch.float16`` on a T4)."""
    import torch
    return getattr(torch, choice.dtype)


def sdpa_kernel(choice: Choice):
    """A context manager restricting scaled_dot_product_attention to the chosen kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel as restrict
    return restrict([getattr(SDPBackend, choice.sdpa)])
