"""The registry: each model built on fake tensors has Meta's published parameter count."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gpumem.memory import models
from gpumem.errors import UsageError
from gpumem.memory.llama import Llama


def build_fake(cfg):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode():
            return Llama(cfg)
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "llama-3.1-405b"])
def test_published_parameter_counts(name):
    cfg = models.get(name)
    model = build_fake(cfg)
    counted = sum(p.numel() for p in model.parameters())
    assert round(counted / 1e9, 2) == cfg.published_params   # 8.03, 70.55, 405.85 (Meta)
    assert counted == cfg.n_params()


def test_meta_ffn_widths():
    # int(8d/3) x multiplier rounded up to multiple_of, from Meta's model.py
    assert [models.get(n).ffn for n in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b")] == [14336, 28672, 53248]


def test_teaching_models_train_on_cpu():
    """The tiny model learns (how fast it runs is ``make bench``'s, not a test's)."""
    torch.manual_seed(0)
    cfg = models.get("tiny")
    model = Llama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, cfg.vocab, (4, 32))
    losses = []
    for _ in range(30):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]   # it memorises the batch


def test_unknown_model_lists_accepted_names():
    with pytest.raises(UsageError, match="accepted: llama-3-8b, llama-3-70b"):
        models.get("llama-2-7b")
