"""Pure bf16's risk in numbers: which updates a bf16 weight cannot take.

bf16 keeps 8 significant bits (7 stored, 1 implicit), so a weight ``w`` with ``2^e <= |w| < 2^(e+1)``
sits on a grid of spacing ``ulp(w) = 2^(e-7)``. Adding an update ``u`` and rounding to nearest
returns ``w`` unchanged when ``|u| < ulp(w) / 2``: the update is lost, and with it every later
update of the same size (a weight that never moves). Mixed precision keeps an fp32 master copy
(24 significant bits) where the same update lands; this is why the planner plans pure bf16 only
when asked.

How many weights lose their update: Adam's step moves each weight by about the learning rate
(``m / sqrt(v)`` is at most about 1 in size), so with ``u = lr`` a weight loses it when
``|w| >= threshold(lr)``. For weights distributed normally with standard deviation ``std`` that is
``erfc(threshold / (std sqrt 2))`` of them. The spread of a trained model's weights is not
published per layer; ``INIT_STD`` (Llama's ``initializer_range`` 0.02, Hugging Face
``LlamaConfig``) is the stated assumption: larger weights lose more.

Learning rates the course quotes (sources): Llama 3 405B's peak pre-training rate 8e-5 (Llama 3
paper, arXiv:2407.21783, section 3.4.1), Llama 2-Chat's supervised fine-tuning rate 2e-5 (Llama 2
paper, arXiv:2307.09288, section 3.1).
"""

import math

from ..errors import UsageError

MANTISSA_BITS = 7              # bf16 stores 7 fraction bits (8 significant with the implicit one)
INIT_STD = 0.02                # assumption: Llama's initializer_range (HF LlamaConfig)
PRETRAIN_LR = 8e-5             # Llama 3 405B peak LR (arXiv:2407.21783, 3.4.1)
FINETUNE_LR = 2e-5             # Llama 2-Chat SFT LR (arXiv:2307.09288, 3.1)


def ulp(w: float) -> float:
    """The spacing of bf16 values around ``w`` (``w`` != 0)."""
    return 2.0 ** (math.floor(math.log2(abs(w))) - MANTISSA_BITS)


def threshold(update: float) -> float:
    """The smallest power of two ``T`` such that every weight with ``|w| >= T`` loses an update of
    size ``update`` (``update < ulp(w) / 2``)."""
    if not update > 0:
        raise UsageError(f"an update size must be positive, got {update!r}")
    # lost when 2^(e - 8) > update, i.e. e > log2(update) + 8: the first such binade starts at 2^e
    e = math.floor(math.log2(update)) + MANTISSA_BITS + 2
    return 2.0 ** e


def lost_share(lr: float, std: float = INIT_STD) -> float:
    """Share of normally distributed weights (standard deviation ``std``) on which an update of
    size ``lr`` rounds away in bf16."""
    return math.erfc(threshold(lr) / (std * math.sqrt(2)))


def risk_line(std: float = INIT_STD) -> str:
    """One sentence with the numbers, at the pre-training and the fine-tuning rate."""
    pre, fine = lost_share(PRETRAIN_LR, std), lost_share(FINETUNE_LR, std)
    return (f"pure bf16 (no fp32 master): an update under half a bf16 ULP of its weight is lost; with "
            f"weights of std {std:g} that is at least {pre:.0%} of weights at lr {PRETRAIN_LR:g} (Llama 3 "
            f"pre-training) and {fine:.0%} at lr {FINETUNE_LR:g} (Llama 2 fine-tuning) -- a floor, as "
            f"Adam's step is usually below lr -- and decoupled weight decay (lr x wd x w) is lost on "
            f"every weight")
