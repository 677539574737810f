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
"""

import textwrap

# plan -> [(framework, how it is written there)]
NAMES = {
    "full": [
        ("PyTorch", "checkpoint(layer, x, use_reentrant=False) around every layer"),
        ("HF", "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})"),
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
        ("torchtitan", "mode = 'selective', selective_ac_option = 'op' (a save list of ops)")],
}

# DeepSpeed's "activation_checkpointing" section: key -> what it does (defaults: all false/None)
DEEPSPEED_KEYS = {
    "partition_activations": "split each checkpoint across the model-parallel ranks",
    "cpu_checkpointing": "move the (partitioned) checkpoints to host memory",
    "contiguous_memory_optimization": "copy checkpoints into one preallocated buffer (less fragmentation)",
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
    lines += [""] + textwrap.wrap("DeepSpeed's JSON section \"activation_checkpointing\" configures its "
                                  "checkpoint function; the model must call deepspeed.checkpointing."
                                  "checkpoint (Megatron-DeepSpeed does). Its keys:", 98)
    lines += [f"  {key:32s} {what}" for key, what in DEEPSPEED_KEYS.items()]
    lines += [""] + textwrap.wrap("Reentrant checkpoints (a torch.autograd.Function that re-runs the "
                                  "whole segment: ours, DeepSpeed's, use_reentrant=True) against "
                                  "non-reentrant ones (saved-tensor hooks, use_reentrant=False), which "
                                  "stop each re-run once backward has what it needs.", 98)
    return "\n".join(lines)
