"""Lab 05's graded cases, drawn afresh at each check (so no list of answers can be kept).

* :func:`bytes_cases`: three (parameters, ranks) pairs, one per size class, never a multiple of
  the ranks (the shard's ceil matters) and never a model size or rank count the lab shows;
* :func:`choose_cases`: four budgets, one per :data:`TEMPLATES` row (GPU, drive, ranks, compute
  and budgets around a model size), whose expected rung is the template's ``target``: neither the
  most offloaded rung nor ZeRO-3 alone, nor what the memory budgets alone give (the least GPU bytes
  that fit); in one the fastest rung that fits memory is not it either, and in one no rung meets
  all three budgets. In each, host memory rules out ``zero3+opt+params-cpu`` (whose step time rests
  on the time engine's assumption that host parameter fetches hide behind compute). Each budget is at
  least :data:`MARGIN` away from every rung's bytes and seconds (asserted here, at draw time).

The figures are the reference's (:mod:`.lab_reference`), the seconds the time engine's.
"""

from gpumem.timing import offload_time

from . import lab_reference as ref

GB = 10**9
MARGIN = 0.05
SHOWN = {1000, 8_030_261_248, 70_553_706_496}          # model sizes the lab's notebook shows
SIZES = ((1_000_001, 4_999_999), (5 * 10**9, 20 * 10**9), (30 * 10**9, 120 * 10**9))
# (parameters, ranks, gpu, drive, compute_s, gpu budget, host budget, step budget, target rung or
# None): the centre of each draw (parameters and budgets scaled together, each by a few per cent)
TEMPLATES = (
    (8.03e9, 4, "a100-80gb", "gen4", 6.0, 20 * GB, 34 * GB, 12.0, "zero2+opt-cpu"),
    (13e9, 8, "h100-80gb", "gen3", 0.5, 30 * GB, 20 * GB, 20.3, "zero3+opt-nvme"),
    (70.55e9, 16, "h100-80gb", "gen4", 4.0, 40 * GB, 83.7 * GB, 14.5, "zero3+opt-cpu"),
    (34e9, 8, "a100-80gb", "gen4", 10.0, 60 * GB, 72 * GB, 15.0, None),
)


def bytes_cases(rng) -> list[tuple[int, int]]:
    """One (parameters, ranks) per size class of :data:`SIZES`."""
    out = []
    for low, high in SIZES:
        while True:
            n, ranks = rng.randrange(low, high), rng.choice((3, 5, 6, 7, 12, 16, 24))
            if n % ranks and n not in SHOWN:
                out.append((n, ranks))
                break
    return out


def figures(n: int, ranks: int, compute_s: float, links) -> dict[str, tuple[int, int, float]]:
    """rung -> (GPU bytes, host bytes, stock seconds), by the reference."""
    out = {}
    for rung in ref.RUNGS:
        t = ref.totals(ref.rung_bytes(n, ranks, rung))
        out[rung] = (t["gpu"], t["cpu"], ref.step_seconds(n, ranks, rung, compute_s, links))
    return out


def _clear(budgets: tuple, fig: dict) -> bool:
    return all(abs(f[i] / b - 1) >= MARGIN for f in fig.values() for i, b in enumerate(budgets) if f[i])


def _answers(budgets: tuple, fig: dict) -> tuple:
    """(the answer, the memory budgets' answer, the fastest that fits memory), with ref.choose's rule."""
    gb, hb, sb = budgets
    memory = [(f[0], f[2], r) for r, f in fig.items() if f[0] <= gb and f[1] <= hb]
    fits = [m for m in memory if fig[m[2]][2] <= sb]
    return (min(fits)[2] if fits else None, min(memory)[2] if memory else None,
            min(memory, key=lambda m: m[1])[2] if memory else None)


def choose_case(rng, template: tuple, tries: int = 2000) -> tuple:
    """(case, the learner's arguments, expected rung, figures) for one template."""
    about, ranks, gpu, drive, compute_about, gb0, hb0, sb0, target = template
    links = offload_time.datasheet_links(gpu, drive, ranks_on_node=min(ranks, 8))
    for _ in range(tries):
        scale = rng.uniform(0.9, 1.1)
        n, compute_s = int(about * scale), round(compute_about * rng.uniform(0.95, 1.05), 2)
        budgets = (round(gb0 * scale * rng.uniform(0.95, 1.05), -8), round(hb0 * scale * rng.uniform(0.97, 1.03), -8),
                   round(sb0 * scale * rng.uniform(0.95, 1.05), 2))
        if n in SHOWN:
            continue
        fig = figures(n, ranks, compute_s, links)
        want, memory, _ = _answers(budgets, fig)
        host_rules_out = fig["zero3+opt+params-cpu"][1] > budgets[1]     # the engine's unmeasured rung
        if want == target and memory not in (None, target) and host_rules_out and _clear(budgets, fig):
            gb, hb, sb = budgets
            case = f"{n / 1e9:.1f} B, {ranks} {gpu[:4].upper()}, {drive} drive, {compute_s} s compute"
            assert want not in ("zero3", "zero3+opt+params-nvme") and ref.choose(
                n, ranks, int(gb), int(hb), sb, compute_s, links) == want
            return case, (n, ranks, int(gb), int(hb), sb, compute_s, links), want, fig
    raise AssertionError(f"no budgets found for {template}")


def choose_cases(rng) -> list[tuple]:
    """One case per template; in at least one the fastest rung that fits memory is not the answer."""
    out = [choose_case(rng, t) for t in TEMPLATES]
    assert any(_answers(c[1][2:5], c[3])[2] != c[2] for c in out)
    return out
