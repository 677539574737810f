"""Chapter 02's ZeRO-3 tables: what one steady step of DeepSpeed's ZeRO-3 gathers at 70B (the
main path's result), DeepSpeed's four schedule keys, and the recorded trace's bytes by the phase
that issues them and the phase they serve (the "Going deeper" section)."""

from gpumem import units
from gpumem.runs import zero3_schedule
from gpumem.memory import models


def zero3_step_summary(model: str = "llama-3-70b", gpus: int = 8) -> str:
    """One steady ZeRO-3 step of ``model`` with DeepSpeed's defaults (replayed): psi gathered for
    forward and for backward, reduce-scattered, the total in bf16 bytes, the module fetches, and
    why the layers are gathered twice (the reuse gap of the last layer against the window)."""
    from .claims import fetches_per_pass, fetches_per_step
    cfg = models.get(model)
    v, psi = zero3_schedule.step_volume(cfg), cfg.n_params()
    head, norms = cfg.vocab * cfg.d_model, 2 * cfg.n_layers + 1
    last = f"layers.{cfg.n_layers - 1}.mlp.down"
    gap, window = zero3_schedule.reuse_gap(cfg, last), int(zero3_schedule.DEFAULTS["stage3_max_reuse_distance"])
    total = 2 * v["per_step_psi"] * psi
    rows = [("gathered for forward", v["for_forward_psi"], f"every weight once ({norms} norms: after the step)"),
            ("gathered for backward", v["for_backward_psi"],
             f"every layer again; the head ({head / psi:.3f} psi) stays whole"),
            ("reduce-scattered", v["reduce_scattered_psi"], "every gradient, once"),
            ("per step", v["per_step_psi"], f"= {units.fmt(total)} of bf16 collectives")]
    lines = [f"{model}, ZeRO-3 with DeepSpeed's defaults (replayed): one steady training step",
             f"{'':22s} {'psi':>6s}"]
    lines += [f"{name:22s} {x:>6.3f}  {what}" for name, x, what in rows]
    lines += [f"on {gpus} GPUs each rank sends and receives {gpus - 1}/{gpus} of it: {units.fmt(total * (gpus - 1) / gpus)}",
              f"module fetches: {fetches_per_step(model):,} per step = 2 passes x "
              f"(7 matrices x {cfg.n_layers} layers + embedding + head = {fetches_per_pass(7, cfg.n_layers)})",
              f"between {last}'s forward and its backward run the final norm and the head, forward",
              f"  and backward: {gap:,} elements, beyond the reuse window ({window:,}): released"]
    return "\n".join(lines)


def gather_phase_table(trace: dict) -> str:
    """Per step, the bytes all-gathered by the phase that issues them and by the phase they
    serve, in units of psi, with DeepSpeed's schedule for Llama-3-70B beside them."""
    psi = 4 * models.get(trace["model"]).n_params()
    heads = (("issued in", "forward"), ("issued in", "backward"), ("serves", "forward"), ("serves", "backward"),
             ("after", "the step"))
    lines = [f"bytes all-gathered per step, in units of psi (the whole model's bytes, here "
             f"{units.fmt(psi, 'MB', 2)} in fp32)",
             f"{'':8s}" + "".join(f"  {a:>9s}" for a, _ in heads),
             f"{'step':8s}" + "".join(f"  {b:>9s}" for _, b in heads)]
    for step, c in trace["counts"].items():
        issued = {ph: sum(e["bytes"] for e in trace["events"] if e["event"] == "all-gather"
                          and f"step{e['step']}" == step and e["phase"] == ph) for ph in ("forward", "backward")}
        row = (issued["forward"] / psi, issued["backward"] / psi, c["gathered_for"]["forward"] / psi,
               c["gathered_for"]["backward"] / psi)
        lines.append(f"{step:8s}" + "".join(f"  {x:>9.3f}" for x in row) + f"  {c['after_step_bytes'] / psi:>9.5f}")
    v = zero3_schedule.step_volume("llama-3-70b")
    g, s, n = v["gathered_elements"], v["served_elements"], v["n_params"]
    row = (g["forward"] / n, g["backward"] / n, s["forward"] / n - g["step"] / n, s["backward"] / n)
    lines.append(f"{'70B':8s}" + "".join(f"  {x:>9.3f}" for x in row) + f"  {g['step'] / n:>9.5f}"
                 + "  (DeepSpeed's defaults, replayed)")
    return "\n".join(lines)


STAGE3_KEYS = (   # (JSON key, what it bounds), each counted in elements (parameters), not bytes
    ("stage3_param_persistence_threshold", "a tensor this small or smaller is persistent: kept whole"),
    ("stage3_max_reuse_distance", "after a module runs, its weights stay whole if the recorded order uses "
                                  "them again within this many elements (the reuse window)"),
    ("stage3_prefetch_bucket_size", "a prefetch stops once this many elements are being gathered ahead of "
                                    "need (the prefetch bucket)"),
    ("stage3_max_live_parameters", "prefetching gathers nothing more once this many elements are "
                                   "whole (the live-parameter limit; one tensor may overshoot it)"),
)


def stage3_keys_table(model: str = "mini") -> str:
    """DeepSpeed's four ZeRO-3 schedule keys: what each bounds, its default (read from DeepSpeed)
    and the value the chapter's trace uses for ``model``, scaled from a Llama-3-70B layer."""
    import textwrap

    from gpumem.runs import ds_audit

    from .ds_ranks import DEFAULTS_70B, scaled_zero3_config
    cfg, big = models.get(model), models.get("llama-3-70b")
    ds, scaled = ds_audit.defaults(), scaled_zero3_config(cfg)
    lines = ["DeepSpeed ZeRO-3 schedule keys; every value counts elements (parameters), not bytes",
             f"{'key':35s} {'default':>8s} {model + ' run':>9s}  what it bounds"]
    for key, meaning in STAGE3_KEYS:
        assert int(ds[key]) == int(DEFAULTS_70B[key]), key
        wrapped = textwrap.wrap(meaning, 44)
        default = f"{int(ds[key]):.0e}".replace("e+0", "e")
        lines.append(f"{key:35s} {default:>8s} {scaled[key]:>9,d}  {wrapped[0]}")
        lines += [f"{'':54s}  {more}" for more in wrapped[1:]]
    lines += [f"{model} run = default x ({model}'s layer, {cfg.layer_params():,} parameters) / "
              f"(Llama-3-70B's layer, {big.layer_params():,}),",
              "  so each key spans the same share of a layer as in 70B; the persistence threshold is at",
              f"  least d_model + 1 = {cfg.d_model + 1} so that the norms stay whole, as in 70B"]
    return "\n".join(lines)


def whole_summary(params: list[str]) -> str:
    """Parameter names grouped by layer for reading: ``embed, layers.0 (all 7 matrices),
    layers.1 (attn.wq, attn.wk, attn.wv)``."""
    groups: dict[str, list[str]] = {}
    for p in params:
        name = p.removesuffix(".weight")
        layer, _, rest = name.partition(".") if not name.startswith("layers.") else \
            (".".join(name.split(".")[:2]), "", ".".join(name.split(".")[2:]))
        groups.setdefault(layer, []).append(rest)
    order = lambda g: (g.startswith("layers."), int(g.split(".")[1]) if g.startswith("layers.") else 0)
    out = []
    for g in sorted(groups, key=order):
        parts = [x for x in groups[g] if x]
        out.append(g if not parts else f"{g} (all {len(parts)} matrices)" if len(parts) == 7
                   else f"{g} ({', '.join(parts)})")
    return ", ".join(out)
