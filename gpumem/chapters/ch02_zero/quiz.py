"""Chapter 02's quiz: what each ZeRO stage leaves on a GPU, how many GPUs ZeRO-3 needs, ZeRO-2's
gradient peak, what ZeRO-3 receives per step, when DeepSpeed keeps a weight whole from forward
to backward, what happens to persistent norms, and how many modules it fetches. Each numeric
attempt draws a model, recipe, GPU count, bucket, reuse distance or architecture; every expected
value is computed by the library (``gpumem.memory``, ``gpumem.runs``). The schedule replays that
a draw needs depend only on the model (and the reuse distance), so they are cached: every seed
redraws every question, and one replay of 70B or 405B takes tens of milliseconds."""

from functools import lru_cache

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick, recipe_numbers
from gpumem.runs import gradmeter, zero3_schedule
from gpumem.memory import accounting, models
from gpumem.units import GB

from .claims import fetches_per_pass

SHARDED = {1: "optimizer states", 2: "gradients and optimizer states",
           3: "parameters, gradients and optimizer states"}
WHOLE = {1: "parameters and gradients stay", 2: "parameters stay", 3: "nothing stays"}
DEEP = ("llama-3-70b", "llama-3.1-405b")   # models where DeepSpeed's defaults keep only the head whole


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


def _sizes(model: str) -> list[int]:
    return list(_sizes_of(model))


@lru_cache(maxsize=None)
def _sizes_of(model: str) -> tuple[int, ...]:
    return tuple(n for own in zero3_schedule.llama_params(models.get(model)).values() for _, n in own)


@lru_cache(maxsize=None)
def _gathered(model: str) -> int:
    """Elements ZeRO-3 all-gathers in one steady step of ``model`` with DeepSpeed's defaults."""
    return sum(zero3_schedule.step_volume(models.get(model))["gathered_elements"].values())


@lru_cache(maxsize=None)
def _gathers_and_gap(model: str, module: str, reuse: float) -> tuple[int, int]:
    """How often ``module``'s weight is all-gathered in a step at reuse distance ``reuse``, and the
    elements run between its forward and its backward."""
    cfg = models.get(model)
    events = zero3_schedule.simulate(zero3_schedule.fetch_order(cfg), zero3_schedule.llama_params(cfg),
                                     {"stage3_max_reuse_distance": reuse})
    gathers = sum(1 for e in events if e["event"] == "all-gather" and f"{module}.weight" in e["params"])
    return gathers, zero3_schedule.reuse_gap(cfg, module)


def _peak(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"gpus": pick(rng, (8, 16, 64)), "bucket": pick(rng, (50_000_000,
                                                                                                200_000_000,
                                                                                                500_000_000))}
    sizes = _sizes(n["model_name"])
    b = gradmeter.peak_bound(sizes, n["gpus"], 2, 2, 2 * n["bucket"])
    return n | {"largest": max(sizes), "bucket_gb": 2 * n["bucket"] / GB, "largest_gb": 2 * max(sizes) / GB,
                "shards_gb": b["shards"] / GB, "zero1_gb": 2 * sum(sizes) / GB, "bound": b["total"] / GB}


def _moved(rng) -> dict:
    n = model_numbers(pick(rng, DEEP)) | {"gpus": pick(rng, (8, 16, 64))}
    cfg = models.get(n["model_name"])
    gathered = _gathered(n["model_name"])
    ring = (n["gpus"] - 1) / n["gpus"]
    return n | {"vocab": cfg.vocab, "head": cfg.vocab * cfg.d_model, "gathered": gathered,
                "received_gb": 2 * gathered * ring / GB, "one_pass_gb": 2 * n["n_params"] * ring / GB,
                "full_gb": 2 * n["n_params"] / GB}


def _reuse(rng) -> dict:
    n = model_numbers(pick(rng, DEEP)) | {"reuse": pick(rng, (1e9, 2e9, 3e9, 5e9, 8e9))}
    cfg = models.get(n["model_name"])
    module = f"layers.{cfg.n_layers - 1}.mlp.down"
    gathers, gap = _gathers_and_gap(n["model_name"], module, n["reuse"])
    verdict = ("kept whole in between, gathered once, for forward" if gathers == 1 else
               "released after its forward, gathered again for backward: twice")
    return n | {"module": module, "head": cfg.vocab * cfg.d_model, "gathers": gathers, "verdict": verdict,
                "gap": gap, "reuse_int": int(n["reuse"])}


ATTENTION = {"separate q, k, v and output projections": 4, "one fused qkv projection and an output projection": 2}
MLP = {"a SwiGLU MLP with separate gate, up and down matrices": 3,
       "a SwiGLU MLP whose gate and up matrices are fused into one, then down": 2,
       "a GELU MLP with an up and a down matrix": 2}
BIASES = {"biases on the q, k and v projections": True, "no biases": False}


def _architecture(rng) -> dict:
    attn, mlp, bias = pick(rng, ATTENTION), pick(rng, MLP), pick(rng, BIASES)
    return {"layers": pick(rng, (24, 32, 40, 48, 60, 80, 96, 126)), "attn": attn, "mlp": mlp, "bias": bias,
            "per_layer": ATTENTION[attn] + MLP[mlp], "biased": BIASES[bias]}


# zero3-received names DeepSpeed's defaults (0.19.8, runtime/zero/config.py): reduce_bucket_size 5e8,
# stage3_prefetch_bucket_size 5e7, stage3_max_reuse_distance 1e9; only the last decides the answer.
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
    Numeric("zero2-peak",
            "{model} ({n_params:,} parameters) trains under ZeRO-2 on {gpus} GPUs with bf16 "
            "gradients. During backward each finished gradient joins a bucket; as soon as the bucket "
            "holds at least {bucket:,} elements it is reduce-scattered in one collective, each GPU "
            "keeps its 1/{gpus} shard of every gradient in it, and the full gradients are freed. The "
            "largest gradient (the embedding's) has {largest:,} elements. What upper bound follows on "
            "the gradient memory (full gradients plus kept shards) one GPU holds at any moment of "
            "backward, in GB (10^9 B)?",
            answer=lambda n: n["bound"], unit="GB", rel_tol=0.01,
            hint="List what can be alive at the same moment: the bucket before it is sent, the "
                 "gradient that has just arrived, and the shards kept so far.",
            explanation="Before it is sent the bucket holds fewer than {bucket:,} elements "
                        "({bucket_gb:.1f} GB); the gradient that has just arrived adds at most the "
                        "embedding's {largest_gb:.2f} GB; by the end the shards reach 2 B x psi/{gpus} = "
                        "{shards_gb:.1f} GB: at most {answer} GB. ZeRO-1 reduces after backward and holds "
                        "every full gradient at once, {zero1_gb:.1f} GB.",
            traps=((lambda n: n["zero1_gb"],
                    "that is every full gradient at once: ZeRO-1's peak, not a bucketed schedule's."),
                   (lambda n: n["bucket_gb"] + n["largest_gb"],
                    "the shards a GPU keeps are gradient memory too, and they grow to 1/{gpus} of all."),
                   (lambda n: n["bucket_gb"] + n["shards_gb"],
                    "the bucket can be just short of full when one more gradient arrives."),
                   (lambda n: n["bucket"] * 2 / GB + n["largest_gb"] + n["zero1_gb"],
                    "a GPU keeps only its 1/{gpus} shard of each reduced gradient.")),
            draw=_peak),
    Numeric("zero3-received",
            "ZeRO-3 on {gpus} ranks trains {model} ({n_params:,} parameters in {layers} layers, bf16 "
            "weights; the embedding and the untied output head are {vocab:,} x {d_model:,} each), one "
            "micro-batch a step, with DeepSpeed's defaults: stage3_max_reuse_distance = 1,000,000,000, "
            "stage3_prefetch_bucket_size = 50,000,000, reduce_bucket_size = 500,000,000, and the RMSNorm "
            "weights persistent (ignore them). In one training step, how many GB (10^9 B) of parameters "
            "does one rank receive through all-gathers?",
            answer=lambda n: n["received_gb"], unit="GB", rel_tol=0.002,
            hint="Which weights are still whole when their backward comes, and which were released "
                 "after forward and must be gathered again? Then: what does a rank already hold of each "
                 "tensor?",
            explanation="Every layer's weights are released after forward (between a layer's forward and "
                        "its backward run at least the head, forward and backward: {head:,} x 2 elements, "
                        "beyond the 1e9 reuse distance) and gathered again; the head's backward follows its "
                        "forward at once, so it stays whole and is gathered once. Gathered per step: "
                        "2 x {n_params:,} - {head:,}; DeepSpeed's replayed schedule gives {gathered:,} "
                        "elements (the norms come back once, after the optimizer step), 2 B each. A rank "
                        "already holds 1/{gpus} of each and receives the other ({gpus}-1)/{gpus}: {answer} "
                        "GB. The buckets set how the bytes are grouped, not how many. The gradients leave by "
                        "reduce-scatter (about one more model's worth), so a ZeRO-3 step moves close to "
                        "3 x the parameter bytes, against 2 x for data parallelism's all-reduce.",
            traps=((lambda n: n["one_pass_gb"],
                    "that is one pass; what does a rank hold of a layer between its forward and its "
                    "backward?"),
                   (lambda n: 2 * n["one_pass_gb"],
                    "that gathers the head twice; it stays whole from its forward to its backward."),
                   (lambda n: 2 * n["gathered"] / GB,
                    "a rank already holds its own 1/{gpus} of every tensor and does not receive it."),
                   (lambda n: n["received_gb"] + n["one_pass_gb"],
                    "gradients leave by reduce-scatter; the question asks for parameters received.")),
            draw=_moved),
    Numeric("reuse-window",
            "DeepSpeed ZeRO-3 trains {model} with stage3_max_reuse_distance = {reuse_int:,}. After a "
            "module's forward its weights stay whole only if the recorded order uses them again "
            "before that many elements of other modules' weights have run; otherwise they are "
            "released and gathered again for backward. The model's final norm has {d_model:,} elements "
            "and its untied output head {head:,}. How many times per steady training step is the weight "
            "of {module} (the last matrix of the last layer) all-gathered?",
            answer=lambda n: n["gathers"], unit="all-gathers", rel_tol=0.0,
            hint="Which modules run between this matrix's forward and its backward, forward and "
                 "backward? Add up their elements and compare with the reuse distance.",
            explanation="Between its forward and its backward run 2 x {head:,} + 2 x {d_model:,} = "
                        "{gap:,} elements, against a reuse distance of {reuse_int:,}: {verdict}. With DeepSpeed's default 1e9 the head alone fills the window, "
                        "so every layer of a 70B or 405B model is gathered twice per step.",
            traps=((lambda n: 3 - n["expected"],
                    "compare the elements between its forward and its backward with the reuse distance "
                    "once more."),
                   (lambda n: 0, "the weight is sharded: its forward has to gather it at least once."),
                   (lambda n: 3, "each pass gathers a weight at most once, and backward only if it was "
                                 "released.")),
            draw=_reuse),
    Choice("persistence",
           "With DeepSpeed ZeRO-3's defaults Llama's RMSNorm weights (d_model elements each, below "
           "stage3_param_persistence_threshold = 100,000) are marked persistent. What happens to "
           "them during training?",
           ["Sharded, and gathered before each module that uses them",
            "Whole in both passes; gathered again after each step",
            "Kept in CPU memory and copied in when a layer needs them",
            "Gathered once at the first step and never released again"],
           answer=1,
           hint="The optimizer step updates every parameter's shard. What happens to a gathered copy "
                "then, and what must be true before the next forward?",
           explanation="Persistent parameters are never released after a module's forward or backward, "
                       "so no fetch gathers them. But the optimizer step releases every parameter, "
                       "persistent ones included (release_and_reset_all checks no persistence), and "
                       "updates the shards; right after it, _post_step all-gathers all persistent "
                       "parameters in one coalesced call. So the norms cost one collective per step, "
                       "not two per norm per pass."),
    Numeric("fetches",
            "A decoder-only model has {layers} layers. Each layer has two RMSNorms, attention with "
            "{attn}, and {mlp}; {bias}. The embedding and the output head are separate (untied). "
            "How many modules does DeepSpeed ZeRO-3 fetch (gather parameters for) in one forward "
            "pass, not counting the norms, whose weights are persistent?",
            answer=lambda n: fetches_per_pass(n["per_layer"], n["layers"]), unit="fetches", rel_tol=0.0,
            hint="DeepSpeed gathers per module that owns parameters: count the weight-carrying "
                 "modules of one layer (a fused matrix is one module; a bias lives in its module).",
            explanation="{per_layer} weight-carrying modules per layer x {layers} + the embedding and "
                        "the head = {answer}.",
            traps=((lambda n: n["per_layer"] * n["layers"],
                    "the embedding and the output head are modules with parameters too."),
                   (lambda n: (n["per_layer"] + 3) * n["layers"] + 2 if n["biased"] else float("nan"),
                    "a bias is a parameter of its Linear module, fetched with the weight."),
                   (lambda n: 7 * n["layers"] + 2,
                    "that is the stock Llama block; count this layer's fused and separate matrices."),
                   (lambda n: (n["per_layer"] + 2) * n["layers"] + 3,
                    "the norms are persistent: whole through forward and backward, not fetched.")),
            draw=_architecture),
])
