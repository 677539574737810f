"""Chapter 02's quiz: what each ZeRO stage leaves on a GPU, how many GPUs ZeRO-3 needs, what it
moves per step and why, and DeepSpeed's gather schedule. Each attempt draws a model, recipe,
stage, GPU and GPU count; every expected value is computed by the library (``gpumem.memory``)."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick, recipe_numbers
from gpumem.memory import accounting
from gpumem.units import GB

SHARDED = {1: "optimizer states", 2: "gradients and optimizer states",
           3: "parameters, gradients and optimizer states"}
WHOLE = {1: "parameters and gradients stay", 2: "parameters stay", 3: "nothing stays"}
LINEAR_PER_LAYER = 7          # q, k, v, o, gate, up, down: the modules ZeRO-3 fetches in a Llama block


def _per_stage(rng) -> dict:
    stage = pick(rng, (1, 2, 3))
    n = (model_numbers(pick(rng, LLAMAS)) | recipe_numbers(pick(rng, ("pure-bf16", "mixed")))
         | {"stage": stage, "gpus": pick(rng, (8, 16, 64)), "sharded": SHARDED[stage], "whole": WHOLE[stage]})
    s = accounting.model_states(n["n_params"], n["recipe_name"], n["gpus"], stage)
    return n | {"p_gb": s.params / GB, "g_gb": s.grads / GB, "o_gb": s.optimizer / GB}


def _per_stage_gb(n: dict) -> float:
    return accounting.model_states(n["n_params"], n["recipe_name"], n["gpus"], n["stage"]).total / GB


def _fewest(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, TRAINING_GPUS)) | recipe_numbers("mixed")
    return n | {"states_gb": accounting.model_states(n["n_params"], "mixed").total / GB}


def fewest_gpus(n_params: int, recipe: str, usable: int) -> int:
    """The fewest GPUs whose ZeRO-3 shard of the model states fits ``usable`` bytes each."""
    gpus = 1
    while accounting.model_states(n_params, recipe, gpus, 3).total > usable:
        gpus += 1
    return gpus


def _moved(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"gpus": pick(rng, (8, 16, 64))}
    p_bytes = accounting.recipe("mixed").params            # bf16 parameters are what is gathered
    one_pass = p_bytes * n["n_params"] * (n["gpus"] - 1) / n["gpus"] / GB
    return n | {"p_bytes": p_bytes, "one_pass_gb": one_pass, "full_gb": p_bytes * n["n_params"] / GB}


def _fetches(rng) -> dict:
    return model_numbers(pick(rng, LLAMAS))


QUIZ = Quiz("02_zero", [
    Numeric("per-stage",
            "{model} ({n_params:,} parameters) trains under ZeRO-{stage} over {gpus} GPUs. Recipe: "
            "{recipe}. How many GB (10^9 B) of model states does each GPU keep?",
            answer=_per_stage_gb, unit="GB", rel_tol=0.01,
            hint="Split the recipe's bytes per parameter into weights, gradients and optimizer "
                 "states; divide by {gpus} only the parts ZeRO-{stage} shards.",
            explanation="ZeRO-{stage} shards the {sharded}; {whole} whole. Per GPU: "
                        "parameters {p_gb:.1f} + gradients {g_gb:.1f} + optimizer {o_gb:.1f} = {answer} GB.",
            traps=((lambda n: n["bytes_per_param"] * n["n_params"] / n["gpus"] / GB,
                    "that divides everything by {gpus}; under ZeRO-{stage} {whole} whole on every "
                    "GPU."),
                   (lambda n: n["bytes_per_param"] * n["n_params"] / GB,
                    "that is one full copy; ZeRO-{stage} splits the {sharded} over {gpus} GPUs.")),
            draw=_per_stage),
    Numeric("fewest-gpus",
            "{model} ({n_params:,} parameters) trains under ZeRO-3. Recipe: {recipe}. Each {gpu} "
            "has {usable:,} bytes usable. What is the fewest GPUs that can hold the sharded model "
            "states, counting nothing else?",
            answer=lambda n: fewest_gpus(n["n_params"], "mixed", n["usable"]), unit="GPUs", rel_tol=0.0,
            hint="The states total {bytes_per_param} B per parameter; every GPU holds 1/N of all of "
                 "them under ZeRO-3.",
            explanation="{bytes_per_param} x {n_params:,} B = {states_gb:,.1f} GB, over {usable_gb:.1f} GB "
                        "usable per GPU: {answer} GPUs. Activations, the gathered parameters of "
                        "the live layer and communication buffers come on top, so a real run needs "
                        "more.",
            traps=((lambda n: fewest_gpus(n["n_params"], "mixed", n["usable"]) - 1,
                    "with that many GPUs each shard is a little too big: round up."),
                   (lambda n: fewest_gpus(n["n_params"], "mixed", n["capacity"]),
                    "you used the reported capacity; the usable bytes are given."),
                   (lambda n: fewest_gpus(n["n_params"], "pure-bf16", n["usable"]),
                    "that would hold 8 B per parameter; count the fp32 master copy and moments.")),
            draw=_fewest),
    Choice("zero2-during-backward",
           "ZeRO-2 shards gradients over N ranks. Why does it reduce-scatter gradients during "
           "backward, bucket by bucket as they are produced, instead of once after "
           "loss.backward() returns?",
           ["A reduce-scatter cannot run once autograd has finished",
            "The optimizer step has to start before backward ends",
            "Waiting would hold every full gradient at once",
            "Reducing after backward gives different gradients"],
           answer=2,
           hint="Compare the gradient bytes alive at the end of backward under the two schedules.",
           explanation="Reduce-scattering each bucket as soon as its gradients are ready, then "
                       "freeing it, keeps about one bucket of full gradients plus the 1/N shard. "
                       "Reducing after backward gives the same result, but every full bf16 "
                       "gradient (2 B per parameter) is alive at the peak: ZeRO-1's memory."),
    Numeric("zero3-received",
            "ZeRO-3 on {gpus} ranks trains {model} ({n_params:,} parameters, bf16 weights). In "
            "one training step, how many GB (10^9 B) of parameters does one rank receive through "
            "all-gathers, forward and backward together? Ignore the few small tensors kept whole.",
            answer=lambda n: 2 * n["one_pass_gb"], unit="GB", rel_tol=0.01,
            hint="Each all-gather of a module gives a rank the parts of it that it does not hold; "
                 "count how often each layer is gathered in one step.",
            explanation="A rank holds 1/{gpus} and receives the other ({gpus}-1)/{gpus} of the "
                        "{p_bytes} B x {n_params:,} = {full_gb:,.1f} GB each time: {one_pass_gb:,.1f} GB in "
                        "forward and again in backward, {answer} GB in all. The gradients leave by "
                        "reduce-scatter (one more such volume), so ZeRO-3 moves 3 x the parameter "
                        "bytes per step against 2 x for plain data parallelism's all-reduce.",
            traps=((lambda n: n["one_pass_gb"],
                    "that is one pass; what does a rank hold of a layer between its forward and its "
                    "backward?"),
                   (lambda n: 2 * n["full_gb"],
                    "a rank already holds its own 1/{gpus} of every tensor and does not receive it."),
                   (lambda n: 3 * n["one_pass_gb"],
                    "gradients leave by reduce-scatter; the question asks for parameters received.")),
            draw=_moved),
    Choice("backward-regathers",
           "Under ZeRO-3, the backward pass all-gathers each layer's parameters again, though the "
           "forward gathered them earlier in the same step. Why?",
           ["The optimizer changed them between forward and backward",
            "After its forward, each module kept only its own shard",
            "Backward needs fp32 weights, and the forward gathered bf16",
            "Backward gathers gradients, not parameters"],
           answer=1,
           hint="In a model of many large layers, what does a rank hold of layer 3's weights "
                "while it runs the forward of layer 60?",
           explanation="DeepSpeed releases a module's gathered parameters after its forward unless "
                       "it is reused within stage3_max_reuse_distance (1e9 elements, about one 70B "
                       "layer), so each rank keeps only its 1/N shard; backward needs the full "
                       "weights again to compute the input gradients."),
    Choice("persistence",
           "With DeepSpeed ZeRO-3's defaults, what happens to Llama's RMSNorm weights (one vector "
           "of d_model elements each, far below stage3_param_persistence_threshold = 100,000)?",
           ["Partitioned, and gathered before every use",
            "Gathered once, then kept whole on every rank",
            "Kept on the CPU and copied in when needed",
            "Never partitioned and never gathered"],
           answer=1,
           hint="The threshold marks small tensors at engine start; a tensor still has to reach "
                "every rank in full at least once.",
           explanation="Parameters below the threshold are marked persistent when the engine starts. "
                       "They are gathered once, while the first step is traced, then kept whole: a "
                       "collective per norm per step would cost more in latency than the bytes it "
                       "saves."),
    Numeric("fetches",
            "How many modules does DeepSpeed ZeRO-3 fetch (gather parameters for) in one forward "
            "pass of {model} ({layers} layers, untied embedding and output head), not counting "
            "the persistent norms?",
            answer=lambda n: LINEAR_PER_LAYER * n["layers"] + 2, unit="fetches", rel_tol=0.0,
            hint="DeepSpeed gathers per submodule that owns parameters. List the linear layers of "
                 "one Llama block: attention, then the SwiGLU MLP.",
            explanation="7 linear modules per layer (q, k, v, o, gate, up, down) x {layers} + the "
                        "embedding and the head = {answer}.",
            traps=((lambda n: 4 * n["layers"],
                    "the SwiGLU MLP has three matrices (gate, up, down), and attention four."),
                   (lambda n: LINEAR_PER_LAYER * n["layers"],
                    "the embedding and the output head are modules with parameters too."),
                   (lambda n: 9 * n["layers"] + 3,
                    "the norms are persistent: kept whole after the first step, not fetched.")),
            draw=_fetches),
])
