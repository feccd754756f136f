"""Build small RLOO, PPO, online-DPO or GRPO runs on the toy task, in-process or as a subprocess that can be killed at
chosen moments.

As a script::

    python tests/support/toy_run.py OUTPUT_DIR [--algorithm rloo|ppo|online-dpo|grpo|distillation|gkd|...] [--resume]
                            [--kill-after-save N] [--kill-during-save N] [--save-live-actor N] [--lora]
                            [--signal-at N [--signal TERM|INT] [--signal-again]] [--fail-save RANK:STEP]
                            [--fail-push STEP]
                            [--real [--live-checks N]] [--tools tools|environment [--kill-in-tool N]] [--vision FAMILY]
                            [--record-trained] [--set key=value ...]

``--set reward_funcs=half_constant`` trains on a reward of ``TOY_REWARDS`` (named, so that crash_fuzz.py can pass it).

writes ``OUTPUT_DIR/final-actor`` and ``OUTPUT_DIR/log_history.json`` when it finishes. Distillation (no rewards)
trains the untrained toy chat model from the trained one (``chat_model_path``) on the chat prompts.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import os
import signal
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, when run as a script

from transformers import TrainerCallback  # noqa: E402

from steadyrl import ALGORITHMS  # noqa: E402
from steadyrl.cli.train import end_processes  # noqa: E402
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path  # noqa: E402

# 4 prompts x 2 samples = 8 samples per rollout; train_batch_size 4 -> 2 mini-batches; 2 epochs -> 4 steps.
DEFAULTS = dict(
    rollout_batch_size=4,
    n_samples_per_prompt=2,
    micro_rollout_batch_size=8,
    train_batch_size=4,
    micro_train_batch_size=2,
    num_ppo_epochs=2,
    max_completion_length=8,
    learning_rate=1e-3,
    lr_scheduler_type="linear",
    warmup_steps=2,
    beta=0.05,
    max_steps=12,
    save_steps=3,
    seed=0,
    logging_steps=1,
    report_to="none",
    disable_tqdm=True,
)


# Per registry name. PPO runs also carry state between rollouts (adaptive kl_coef, running score moments)
# through checkpoints.
ALGORITHM_DEFAULTS = {
    "rloo": {},
    "ppo": dict(target_kl=0.5, kl_horizon=100, normalize_reward=True, kl_estimator="k3", missing_eos_penalty=0.1),
    # online DPO: a beta schedule over epochs; with 8 prompts the third rollout (steps 9-12) starts epoch 1.
    "online-dpo": dict(beta=[0.1, 0.2], missing_eos_penalty=0.1),
    # GRPO: the KL term in the loss, DAPO's global token normaliser, clip-higher, batch-scaled rewards
    "grpo": dict(loss_type="dapo", scale_rewards="batch", epsilon_high=0.28),
    # distillation: the generalized JSD at a temperature other than 1
    "distillation": dict(beta=0.5, temperature=0.9),
}
DATASETS = {"online-dpo": dict(num_prompts=8)}

# --real: SmolLM2-135M-Instruct on the arithmetic task. 2 prompts x 2 samples; train_batch_size 2 -> 2 steps per
# rollout, so checkpoint-1 falls in the middle of the first rollout.
REAL_DEFAULTS = dict(
    rollout_batch_size=2,
    n_samples_per_prompt=2,
    micro_rollout_batch_size=4,
    train_batch_size=2,
    micro_train_batch_size=1,
    num_ppo_epochs=1,
    max_completion_length=8,
    learning_rate=1e-5,
    warmup_steps=0,
    max_steps=2,
    save_steps=1,
)


def shorter_is_better(completions, **kwargs) -> list[float]:
    """A dense reward for runs too short to learn the task: sampled completions differ in length, so advantages
    (and gradients) are not all zero."""
    return [-len(completion[-1]["content"]) / 32 for completion in completions]


def real_task() -> dict:
    """The trainer arguments of a real-model run: SmolLM2-135M-Instruct, the arithmetic dataset and its rewards."""
    from steadyrl.real import answer_format, arithmetic_dataset, correct_answer, smollm2_path

    return dict(
        model=smollm2_path(),
        train_dataset=arithmetic_dataset(size=64),
        reward_funcs=[correct_answer, answer_format, shorter_is_better],
    )


def half_constant_reward(prompts, completions, **kwargs) -> list[float]:
    """0.5 for every completion of a prompt whose word starts with a-m (a group without signal, for
    ``dynamic_sampling`` to drop), else a hash of the completion in [0, 1) (distinct completions differ)."""
    return [
        0.5 if prompt[0] < "n" else zlib.crc32(completion.encode()) / 2**32
        for prompt, completion in zip(prompts, completions)
    ]


def half_constant_logging_on_process_0(prompts, completions, log_metric, **kwargs) -> list[float]:
    """``half_constant_reward``, and a metric that only the first process logs (TRL's ``log_metric``), as a count of
    format errors logged only when there are some: the processes' metrics must be reduced by name."""
    if int(os.environ.get("RANK", "0")) == 0:
        log_metric("logged_on_process_0", 100.0)
    return half_constant_reward(prompts, completions, **kwargs)


# reward_funcs="<name>" (--set reward_funcs=half_constant)
TOY_REWARDS = {"half_constant": half_constant_reward, "half_constant_logging_on_0": half_constant_logging_on_process_0}


def recording(reward_func, path: str):
    """``reward_func`` (under its own name, so the logged reward keys stay) writing the prompts and completions of its
    first call, as TRL passes them, to ``path`` (JSON)."""
    import functools

    @functools.wraps(reward_func)
    def recorded(prompts, completions, **kwargs):
        if not os.path.exists(path):
            with open(path, "w") as f:
                json.dump({"prompts": prompts, "completions": completions}, f)
        return reward_func(prompts=prompts, completions=completions, **kwargs)

    return recorded


def live_checks(trainer, output_dir: str, size: int) -> None:
    """What the live actor does right after ``train()``, for a test to compare with a model loaded from disk:
    its greedy replies to ``size`` held-out problems, then a user's own ``generate`` of the first one (token ids of
    prompt and reply), written to OUTPUT_DIR/live_actor.json."""
    from steadyrl.real import arithmetic_dataset, greedy_accuracy

    model, tokenizer = trainer.model, trainer.processing_class
    held_out = arithmetic_dataset("eval", size=size)
    _, replies = greedy_accuracy(model, tokenizer, held_out, max_new_tokens=12)
    question = tokenizer.apply_chat_template(
        held_out[0]["prompt"], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    generated = model.generate(**question, do_sample=False, max_new_tokens=12)
    with open(os.path.join(output_dir, "live_actor.json"), "w") as f:
        json.dump({"greedy_replies": replies, "generate": generated.tolist(), "training": model.training}, f)


def tool_task(kind: str) -> dict:
    """The trainer arguments of a multi-turn run on the tool fixture: ``tools=[add]``, or ``Calculator``."""
    from steadyrl.toy.tools import Calculator, add, correct_sum, sum_dataset, tool_model_path, tool_tokenizer

    task = dict(
        model=tool_model_path(),
        processing_class=tool_tokenizer(),
        train_dataset=sum_dataset(16),
        reward_funcs=[correct_sum, shorter_is_better],
        max_completion_length=128,
        max_tool_calling_iterations=2,
    )
    return {**task, "tools": [add]} if kind == "tools" else {**task, "environment_factory": Calculator}


def vision_task(family: str, algorithm: str = "grpo") -> dict:
    """--vision FAMILY: the family's stand-in and processor on the coloured squares (steadyrl.toy.vision); ``tools``:
    the Qwen2.5-VL stand-in that calls tools, on the sums, with a tool whose reply shows the sum as a picture."""
    from steadyrl.toy.vision import build_processor, colour_dataset, colour_letters_reward, vision_model_path

    if family == "tools":
        from steadyrl.toy.vision import add, vision_tool_model_path, vision_tool_tokenizer

        processor = build_processor("qwen2_5_vl", vision_tool_tokenizer())
        task = {**tool_task("tools"), "learning_rate": 1e-4}  # 1e-3 unlearns the tool calls within 4 steps
        return {**task, "model": vision_tool_model_path(), "processing_class": processor, "tools": [add]}

    task = dict(
        model=vision_model_path(family), processing_class=build_processor(family), train_dataset=colour_dataset(16)
    )
    if algorithm in ("distillation", "gkd"):  # a teacher of the same family, initialised from another seed
        return {**task, "teacher_model": vision_model_path(family, seed=1)}
    return {**task, "reward_funcs": [colour_letters_reward]}


def make_config(output_dir, algorithm="rloo", **overrides):
    settings = {**DEFAULTS, **ALGORITHM_DEFAULTS.get(algorithm, {}), **overrides}
    return ALGORITHMS[algorithm].config_class(output_dir=str(output_dir), **settings)


def make_trainer(
    output_dir,
    callbacks=None,
    reward_funcs=None,
    train_dataset=None,
    trainer_cls=None,
    algorithm="rloo",
    judge=None,
    peft_config=None,
    model=None,
    eval_dataset=None,
    reward_model=None,
    reward_processing_class=None,
    ref_model=None,
    processing_class=None,
    tools=None,
    environment_factory=None,
    rollout_func=None,
    **overrides,
):
    trainer_cls = trainer_cls or ALGORITHMS[algorithm].trainer_class
    if not trainer_cls.algorithm_class.uses_rewards:  # distillation: a teacher instead of rewards
        from steadyrl.toy import chat_dataset, chat_model_path, untrained_chat_model_path

        extra = dict(peft_config=peft_config, processing_class=processing_class, tools=tools, eval_dataset=eval_dataset)
        teacher = overrides.pop("teacher_model", None) or chat_model_path()
        return trainer_cls(
            model=model or untrained_chat_model_path(),
            teacher_model=teacher,
            args=make_config(output_dir, algorithm, **overrides),
            train_dataset=chat_dataset("train") if train_dataset is None else train_dataset,
            callbacks=callbacks,
            **{key: value for key, value in extra.items() if value is not None},
        )
    extra = {
        "judge": judge,
        "peft_config": peft_config,
        "eval_dataset": eval_dataset,
        "reward_model": reward_model,
        "reward_processing_class": reward_processing_class,
        "ref_model": ref_model,
        "processing_class": processing_class,
        "tools": tools,
        "environment_factory": environment_factory,
        "rollout_func": rollout_func,
    }
    extra = {key: value for key, value in extra.items() if value is not None}
    return trainer_cls(
        model=model or toy_model_path(),
        args=make_config(output_dir, algorithm, **overrides),
        train_dataset=toy_dataset(**DATASETS.get(algorithm, {})) if train_dataset is None else train_dataset,
        reward_funcs=[letters_reward] if reward_funcs is None else toy_rewards(reward_funcs),
        callbacks=callbacks,
        **extra,
    )


def gkd_dataset():
    """The toy chat prompts in TRL's GKD format: a ``messages`` conversation whose last message, the completion of
    GKD's off-policy rollouts, is the assistant's answer (the word's letters)."""
    from steadyrl.toy import chat_dataset

    def with_answer(row):
        return {"messages": row["prompt"] + [{"role": "assistant", "content": row["letters"]}]}

    return chat_dataset("train").map(with_answer, remove_columns=["prompt", "letters"])


def toy_rewards(reward_funcs):
    """``reward_funcs`` as given, or a toy reward of ``TOY_REWARDS`` by name (from the command line)."""
    return [TOY_REWARDS[reward_funcs]] if isinstance(reward_funcs, str) else reward_funcs


class KillAfterSave(TrainerCallback):
    """SIGKILL this process right after checkpoint-<step> is complete."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def killed_in_tool_call(output_dir: str, step: int) -> type:
    """--kill-in-tool STEP: the tool fixture's ``Calculator``, whose tool SIGKILLs its process inside the first call
    made once checkpoint-STEP is complete (its trainer state written last): with generation ahead, on the worker
    thread, between two turns of a trajectory."""
    from steadyrl.toy.tools import Calculator

    written = os.path.join(output_dir, f"checkpoint-{step}", "trainer_state.json")

    class KilledInToolCall(Calculator):
        @functools.wraps(Calculator.add)
        def add(self, a: int, b: int) -> int:
            if os.path.exists(written):
                os.kill(os.getpid(), signal.SIGKILL)
            return super().add(a, b)

    KilledInToolCall.__name__ = "Calculator"  # its reward function's name, as logged
    return KilledInToolCall


class RecordTrained(TrainerCallback):
    """--record-trained: after each step, the rollout it trained on (every sample's prompt and completion ids, and
    its prompt's row in the dataset), appended to OUTPUT_DIR/trained.jsonl by the main process. A resumed run appends
    the steps it runs again; the last record of a step is what that step trained on."""

    def __init__(self, path: str) -> None:
        self.path, self.trainer = path, None

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        rollout = self.trainer.training_buffer.buffer.rollout
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)]
        completions = [ids[mask.bool()].tolist() for ids, mask in zip(rollout.completion_ids, rollout.completion_mask)]
        index = None if rollout.prompt_index is None else rollout.prompt_index.tolist()
        entry = {"step": state.global_step, "prompt_ids": prompts, "completion_ids": completions, "prompt_index": index}
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def read_trained(output_dir) -> dict[int, dict]:
    """``--record-trained``'s records by step: each step's last."""
    with open(os.path.join(output_dir, "trained.jsonl")) as f:
        return {entry["step"]: entry for entry in map(json.loads, f)}


class GatheredPeak(TrainerCallback):
    """Under ZeRO-3, the most elements of the actor's partitioned parameters (persistent small ones aside) held whole
    at once as any module's forward pass in training mode ends (``peak``), and in eval mode, generation's
    (``generation_peak``: the whole actor, unless ds3_gather_for_generation=False), in the steps up to global step
    ``step``; written to OUTPUT_DIR/gathered-<step>-<rank>.json."""

    def __init__(self, step: int) -> None:
        self.step, self.peak, self.generation_peak, self.params = step, 0, 0, []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.params = [p for p in model.parameters() if hasattr(p, "ds_id") and not p.ds_persist]
        if self.params:
            for module in model.modules():
                module.register_forward_hook(self.probe)

    def probe(self, module, inputs, output) -> None:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        whole = sum(p.ds_numel for p in self.params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)
        if module.training:
            self.peak = max(self.peak, whole)
        else:
            self.generation_peak = max(self.generation_peak, whole)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and self.params:
            path = os.path.join(args.output_dir, f"gathered-{self.step}-{os.environ.get('RANK', '0')}.json")
            with open(path, "w") as f:
                total = sum(p.ds_numel for p in self.params)
                json.dump({"peak": self.peak, "generation_peak": self.generation_peak, "total": total}, f)


class SaveLiveActor(TrainerCallback):
    """After global step ``step``, write the actor's live parameters to OUTPUT_DIR/live-actor-<step>.safetensors,
    gathered with DeepSpeed's own ``GatheredParameters`` under ZeRO-3, with ``DTensor.full_tensor`` under FSDP2
    (independently of the checkpoint code)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step != self.step:
            return
        from safetensors.torch import save_file
        from torch.distributed.tensor import DTensor

        params = {name: p.full_tensor() if isinstance(p, DTensor) else p for name, p in model.named_parameters()}
        with contextlib.ExitStack() as stack:
            if any(hasattr(p, "ds_id") for p in params.values()):
                import deepspeed

                stack.enter_context(deepspeed.zero.GatheredParameters(list(params.values())))
            if state.is_world_process_zero:
                weights = {name: p.detach().clone().contiguous() for name, p in params.items()}
                save_file(weights, os.path.join(args.output_dir, f"live-actor-{self.step}.safetensors"))


class SignalAt(TrainerCallback):
    """Send the main process ``signum`` as step ``step + 1`` begins; with ``again``, once more as it ends. The
    other processes of a distributed run get no signal: they must learn of it from the main one."""

    def __init__(self, step: int, signum: int, again: bool = False) -> None:
        self.step, self.signum, self.again = step, signum, again

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step and state.is_world_process_zero:
            os.kill(os.getpid(), self.signum)

    def on_step_end(self, args, state, control, **kwargs):
        if self.again and state.global_step == self.step + 1 and state.is_world_process_zero:
            os.kill(os.getpid(), self.signum)


def kill_during_save(trainer, step: int) -> None:
    """SIGKILL this process in the middle of writing checkpoint-<step> (after its actor weights, before the rest)."""
    save_actor = trainer.save_actor

    def dying_save_actor(directory):
        save_actor(directory)
        if trainer.state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)

    trainer.save_actor = dying_save_actor


def fail_push(trainer, step: int) -> None:
    """Make the main process's Hub push of checkpoint-<step> fail with an error that is not the Hub's (a bug)."""
    push = trainer.push_checkpoint

    def failing_push(checkpoint, at_step):
        if at_step == step:
            raise RuntimeError(f"injected failure in the push of step {step}")
        push(checkpoint, at_step)

    trainer.push_checkpoint = failing_push


def fail_save(trainer, rank: int, step: int) -> None:
    """Make process ``rank``'s part of checkpoint-<step> fail as a full disk would (OSError ENOSPC); the other
    processes write theirs."""
    write = trainer.checkpointer._write

    def failing_write(tmp, contents):
        if trainer.accelerator.process_index == rank and trainer.state.global_step == step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
        write(tmp, contents)

    trainer.checkpointer._write = failing_write


def _parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_overrides(items: list[str]) -> dict:
    """``["key=value", ...]`` with JSON values (plain strings otherwise) -> config overrides."""
    return {key: _parse_value(value) for key, value in (item.split("=", 1) for item in items)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="rloo")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-after-save", type=int)
    parser.add_argument("--kill-during-save", type=int)
    parser.add_argument(
        "--kill-in-tool", type=int, help="STEP: with --tools environment, killed in a tool call after it"
    )
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (peft_config)")
    parser.add_argument("--save-live-actor", type=int, help="write the live actor's weights after this step")
    parser.add_argument("--signal-at", type=int, help="send --signal to itself as the step after this one begins")
    parser.add_argument("--signal", choices=["TERM", "INT"], default="TERM")
    parser.add_argument("--signal-again", action="store_true", help="and a second one as that step ends")
    parser.add_argument("--fail-save", help="RANK:STEP: that process's part of checkpoint-STEP fails (no space)")
    parser.add_argument("--fail-push", type=int, help="STEP: the main process's push of checkpoint-STEP fails (a bug)")
    parser.add_argument("--eval-prompts", type=int, help="evaluate on this many held-out toy prompts every 2 steps")
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct on the arithmetic task")
    parser.add_argument(
        "--live-checks",
        type=int,
        help="with --real: record the reward inputs (reward_inputs.json) and, after training, the live actor's greedy "
        "replies to this many held-out problems and its generate of the first (live_actor.json)",
    )
    parser.add_argument("--tools", choices=["tools", "environment"], help="multi-turn, on the tool fixture")
    parser.add_argument("--poison-grad", help="STEP[,STEP...]: a NaN gradient element on process 0 in those steps")
    parser.add_argument(
        "--vision",
        help="a vision-language stand-in: qwen2_5_vl or llava_next, on coloured squares; tools: "
        "Qwen2.5-VL calling a tool whose reply holds an image",
    )
    parser.add_argument("--record-trained", action="store_true", help="what each step trains on: trained.jsonl")
    parser.add_argument("--set", nargs="*", default=[], help="config overrides key=value (JSON values)")
    opts = parser.parse_args()
    overrides = parse_overrides(opts.set)
    if opts.real:
        overrides = {**REAL_DEFAULTS, **real_task(), **overrides}
        if opts.live_checks:
            first, *others = overrides["reward_funcs"]
            overrides["reward_funcs"] = [recording(first, os.path.join(opts.output_dir, "reward_inputs.json")), *others]
    if opts.tools:
        overrides = {**tool_task(opts.tools), **overrides}
    if opts.kill_in_tool:
        overrides["environment_factory"] = killed_in_tool_call(opts.output_dir, opts.kill_in_tool)
    if opts.vision:
        overrides = {**vision_task(opts.vision, opts.algorithm), **overrides}
    callbacks = [KillAfterSave(opts.kill_after_save)] if opts.kill_after_save else []
    if opts.save_live_actor:
        callbacks += [SaveLiveActor(opts.save_live_actor), GatheredPeak(opts.save_live_actor)]
    signum = getattr(signal, f"SIG{opts.signal}")
    callbacks += [SignalAt(opts.signal_at, signum, opts.signal_again)] if opts.signal_at is not None else []
    if opts.lora:
        from peft import LoraConfig

        overrides["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    if opts.eval_prompts:
        overrides.update(
            eval_dataset=toy_dataset(num_prompts=opts.eval_prompts, seed=1),
            eval_strategy="steps",
            eval_steps=2,
            per_device_eval_batch_size=4,
        )
    if opts.algorithm == "gkd":
        overrides.setdefault("train_dataset", gkd_dataset())
    recorder = RecordTrained(os.path.join(opts.output_dir, "trained.jsonl")) if opts.record_trained else None
    callbacks += [recorder] if recorder else []
    trainer = make_trainer(opts.output_dir, callbacks=callbacks, algorithm=opts.algorithm, **overrides)
    if recorder:
        recorder.trainer = trainer
    if opts.poison_grad:
        from poison import poison_gradient  # tests/support, this script's own folder

        poison_gradient(trainer, [int(step) for step in opts.poison_grad.split(",")])
    if opts.kill_during_save:
        kill_during_save(trainer, opts.kill_during_save)
    if opts.fail_save:
        fail_save(trainer, *map(int, opts.fail_save.split(":")))
    if opts.fail_push:
        fail_push(trainer, opts.fail_push)
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    if opts.live_checks:
        live_checks(trainer, opts.output_dir, opts.live_checks)
    trainer.save_model(os.path.join(opts.output_dir, "final-actor"))
    if trainer.is_world_process_zero():  # one writer: on several machines output_dir is shared
        with open(os.path.join(opts.output_dir, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
    end_processes(trainer)  # as `steadyrl train` ends: on gloo, interpreter teardown may abort a finished process


if __name__ == "__main__":
    main()
