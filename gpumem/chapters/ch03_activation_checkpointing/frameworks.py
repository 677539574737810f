"""Chapter 03 in the frameworks people train with: the same plans under their own names.

Sources (read, not run, except PyTorch and DeepSpeed, which the chapter runs): PyTorch 2.13
``torch/utils/checkpoint.py`` (``checkpoint``, ``checkpoint_sequential``,
``create_selective_checkpoint_contexts``, ``CheckpointPolicy``); DeepSpeed 0.19.8
``runtime/activation_checkpointing/config.py`` (the six ``activation_checkpointing`` keys) and
``checkpointing.py`` (``CheckpointFunction``, reentrant); Megatron-LM's arguments
(``--recompute-granularity``, ``--recompute-method``, ``--recompute-num-layers``; Megatron Core
adds ``--recompute-modules``) as documented by NVIDIA's Megatron Bridge pages; Hugging Face
Transformers ``PreTrainedModel.gradient_checkpointing_enable``; torchtitan
``torchtitan/distributed/activation_checkpoint.py`` (``mode``, ``selective_ac_option``); PyTorch's
``torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py`` (``checkpoint_wrapper``,
``apply_activation_checkpointing``, used with FSDP2's ``fully_shard``) and ``torch/nn/attention``
(``sdpa_kernel``, ``SDPBackend``); Hugging Face's ``attn_implementation`` values.

torchtitan's ``selective_ac_option = 'op'`` is not the chapter's SAC: its policy
(``_get_custom_policy`` over ``_save_list`` in ``torchtitan/models/llama3/parallelize_llama.py``,
pytorch/torchtitan at 01c79fdf) counts the ``aten.mm`` calls of a block and saves the outputs of
the listed compute ops "except every second mm", so a Llama block's 2nd, 4th and 6th matmuls
(wk, wo, w3 in its forward order wq, wk, wv, wo, w1, w3, w2) are re-run: :func:`torchtitan_op`.
torchtitan's main branch has since replaced the counter by a list of named tensors
(``sac_save_list``) and added ``mode = 'memory_budget'`` (torch.compile's activation budget).
"""

import textwrap

from gpumem.memory import models, recompute_cost

# a torchtitan Llama block's matmuls in forward order (Attention.forward, FeedForward.forward)
TORCHTITAN_MM_ORDER = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
# DeepSpeed 0.19.8, deepspeed/runtime/...: where the JSON section is parsed and where it is applied
DEEPSPEED_SOURCE = {
    "parsed": ("runtime/config.py", 503, "self.activation_checkpointing_config = ..."),
    "applied": ("runtime/activation_checkpointing/checkpointing.py", 1121, "def _configure_using_config_file"),
    "configure": ("runtime/activation_checkpointing/checkpointing.py", 1152, "def configure("),
    "checkpoint": ("runtime/activation_checkpointing/checkpointing.py", 1048, "def checkpoint("),
    "non_reentrant": ("runtime/activation_checkpointing/checkpointing.py", 788, "def non_reentrant_checkpoint("),
}


def torchtitan_op(model: str = "llama-3-8b", seq: int = 4096, batch: int = 1) -> dict:
    """What torchtitan's ``selective_ac_option = 'op'`` re-runs: every second matmul of each block
    (its counter's even calls), with the attention kernel's output saved. FLOPs of those matmuls'
    forward, their share of a layer's matmul FLOPs, and of forward + backward."""
    cfg = models.get(model)
    T, h, k, F = batch * seq, cfg.d_model, cfg.kv_dim, cfg.ffn
    size = {"wq": h * h, "wk": h * k, "wv": h * k, "wo": h * h, "w1": h * F, "w3": h * F, "w2": F * h}
    rerun = [name for i, name in enumerate(TORCHTITAN_MM_ORDER, 1) if i % 2 == 0]
    layer = sum(2 * T * size[n] for n in rerun)
    f = recompute_cost.step_flops(cfg, seq, batch, "none")
    return {"rerun": rerun, "flops": cfg.n_layers * layer,
            "matmul_share": layer / recompute_cost.layer_flops(cfg, seq, batch)["matmuls"],
            "overhead": cfg.n_layers * layer / (f["forward"] + f["backward"])}


def deepspeed_json_note() -> str:
    """Why DeepSpeed's ``activation_checkpointing`` JSON section does nothing by itself, with the
    file and line of DeepSpeed 0.19.8 behind each step."""
    src = {k: f"{f}:{line}" for k, (f, line, _) in DEEPSPEED_SOURCE.items()}
    return ("DeepSpeed's JSON section \"activation_checkpointing\" checkpoints nothing by itself. "
            f"deepspeed.initialize parses it ({src['parsed']}) and runtime/engine.py never reads it; only "
            f"deepspeed.checkpointing.configure(mpu, deepspeed_config=...) ({src['configure']}) applies it "
            f"({src['applied']}), and only to the model's own calls to deepspeed.checkpointing.checkpoint "
            f"({src['checkpoint']}). Megatron-DeepSpeed calls both; a Hugging Face model checkpoints "
            f"through PyTorch instead. DeepSpeed also ships non_reentrant_checkpoint ({src['non_reentrant']}): "
            "saved-tensor hooks like PyTorch's, but it re-runs each segment to its end (measured below). "
            "Paths under deepspeed/, DeepSpeed 0.19.8. Its keys:")

# plan -> [(framework, how it is written there)]
NAMES = {
    "full": [
        ("PyTorch", "checkpoint(layer, x, use_reentrant=False) around every layer"),
        ("HF", "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs= {'use_reentrant': False})"),
        ("DeepSpeed", "deepspeed.checkpointing.checkpoint(layer, x) per layer (the model calls it)"),
        ("Megatron", "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
        ("torchtitan", "[activation_checkpoint] mode = 'full'"),
        ("FSDP2", "apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper, "
                  "check_fn=lambda m: isinstance(m, Layer)), applied before fully_shard(layer) and "
                  "fully_shard(model), so each layer is re-run inside its own all-gather")],
    "every-K": [
        ("PyTorch", "checkpoint_sequential(layers, segments=n/K, input) or checkpoint() around K layers"),
        ("Megatron", "--recompute-granularity full --recompute-method uniform --recompute-num-layers K")],
    "first-c": [
        ("Megatron", "--recompute-granularity full --recompute-method block --recompute-num-layers c "
                     "(per pipeline stage; the other layers keep their activations)")],
    "every-other": [
        ("torchtitan", "mode = 'selective', selective_ac_option = '2' (every second layer)")],
    "selective": [
        ("Megatron", "--recompute-granularity selective (Megatron Core: --recompute-modules core_attn)"),
        ("FlashAttention", "already re-runs QK^T and softmax in its backward: the same saving, built in"),
        ("PyTorch SDPA", "keeps the s x s scores (where selective pays) only on the math backend, "
                         "with sdpa_kernel(SDPBackend.MATH) or when no fused kernel applies; the flash "
                         "and memory-efficient backends keep none"),
        ("HF", "attn_implementation='eager' materialises the scores; 'sdpa' (fused backends) and "
               "'flash_attention_2' do not")],
    "sac": [
        ("PyTorch", "checkpoint(layer, x, use_reentrant=False, context_fn=lambda: "
                    "create_selective_checkpoint_contexts(policy)), policy -> CheckpointPolicy.MUST_SAVE "
                    "or PREFER_RECOMPUTE per op"),
        ("torchtitan", "not selective_ac_option = 'op': that policy saves the listed compute ops' "
                       "outputs except every second matmul, so each block re-runs wk, wo and w3 "
                       "(see below)")],
}

# DeepSpeed's "activation_checkpointing" section: key -> what it does (defaults: all false/None)
DEEPSPEED_KEYS = {
    "partition_activations": "split each checkpoint across the model-parallel ranks",
    "cpu_checkpointing": "move the (partitioned) checkpoints to host memory",
    "contiguous_memory_optimization": "copy checkpoints into one preallocated buffer (less fragmenting)",
    "number_checkpoints": "how many checkpoints that buffer holds",
    "synchronize_checkpoint_boundary": "synchronize the device at each checkpoint (for profiling)",
    "profile": "time the forward and recompute of each checkpoint",
}


def frameworks_table() -> str:
    """Each plan of the chapter in PyTorch, Hugging Face, DeepSpeed, Megatron-LM, torchtitan and FSDP2."""
    lines = [f"{'plan':12s} {'framework':14s} how it is written", "-" * 98]
    for plan, names in NAMES.items():
        for i, (framework, how) in enumerate(names):
            head = f"{plan if i == 0 else '':12s} {framework:14s} "
            lines += textwrap.wrap(how, 98, initial_indent=head, subsequent_indent=" " * (len(head) + 2),
                                   break_on_hyphens=False, break_long_words=False)
    tt = torchtitan_op()
    lines += [""] + textwrap.wrap(
        "torchtitan's mode = 'selective', selective_ac_option = 'op' counts each block's matmuls and "
        "re-runs every second one (" + ", ".join(tt["rerun"]) + f"): {tt['matmul_share']:.0%} of a "
        f"layer's matmul FLOPs, +{100 * tt['overhead']:.1f} % of forward + backward at Llama-3-8B, s 4096, "
        "where the chapter's sac (every matmul output kept) re-runs none.", 98, break_on_hyphens=False)
    lines += [""] + textwrap.wrap(deepspeed_json_note(), 98)
    lines += [f"  {key:32s} {what}" for key, what in DEEPSPEED_KEYS.items()]
    lines += [""] + textwrap.wrap("Reentrant checkpoints (a torch.autograd.Function that re-runs the "
                                  "whole segment: ours, DeepSpeed's, use_reentrant=True) against "
                                  "non-reentrant ones (saved-tensor hooks): PyTorch's (use_reentrant=False) "
                                  "stops each re-run once backward has what it needs (the early-stop "
                                  "re-run); DeepSpeed's non_reentrant_checkpoint runs it to the end "
                                  "(the whole-segment re-run).", 98)
    return "\n".join(lines)
