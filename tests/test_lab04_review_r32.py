"""Lab 04, review r32: findings fixed after that round's reading of the lab."""

import torch

from gpumem.chapters.ch04_flash_attention.labexp2 import Exp2Rule
from gpumem.chapters.ch04_flash_attention.labops import QK, RAW, _ptr


def test_numbers_from_python_take_no_tag_a_dead_tensor_left_at_their_address():
    """#2: tags are kept by storage address. ``torch.tensor`` of Python numbers makes its storage
    outside dispatch, then ``lift_fresh`` passes it through; where a dead tile's tag was still kept
    at that address, the fresh tensor was refused as "made from both Q and K". Here the stale tag
    is planted at the fresh tensor's own address (the allocator reused one in the reviewer's run)."""
    q, k = torch.randn(1, 2, 8, 4, dtype=torch.float64), torch.randn(1, 1, 8, 4, dtype=torch.float64)
    rule = Exp2Rule(4, q, k)
    fresh = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    rule.tags[_ptr(fresh)] = (QK, RAW)                     # what a freed score tile left there
    rule.origins[_ptr(fresh)] = (object(), 64, None)
    rule.note("lift_fresh", (fresh,), {}, fresh)
    assert rule._tag(fresh) == (0, None) and rule.origins.get(_ptr(fresh)) is None
    tile = q[0, 0] @ k[0, 0].T                               # a live tile keeps its tag through a view
    rule.note("mm", (q[0, 0], k[0, 0].T), {}, tile)
    assert rule._tag(tile)[0] == QK
    rule.note("view", (tile, [-1]), {}, tile.view(-1))
    assert rule._tag(tile.view(-1))[0] == QK
