import torch, torch.distributed as dist
def probe(rank, world):
    out = {}
    x = torch.arange(4.0) + rank
    o = torch.empty(2)
    try:
        dist.reduce_scatter_tensor(o, x); out["rs"] = o.tolist()
    except Exception as e: out["rs"] = repr(e)[:100]
    g = torch.empty(4)
    try:
        dist.all_gather_into_tensor(g, torch.tensor([1.0, 2.0]) + rank); out["ag"] = g.tolist()
    except Exception as e: out["ag"] = repr(e)[:100]
    return out
