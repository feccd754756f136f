"""max_staleness: rollouts generated (and scored) on a vLLM server while the trainer trains. The lag is logged, the
loss corrects it with the sampling policy's own log-probs, and a run killed at any moment resumes byte-identical
(crash fuzzing against the server)."""

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import (
    ASYNC,
    CONFIGS,
    MULTI_CPU,
    ROOT,
    TWO_PROCESSES,
    ZERO,
    assert_close_weights,
    read_logs,
    run_toy,
    step_entries,
)
from support.stream_run import write_prompt_files
from support.toy_run import make_trainer, read_trained
from support.vllm_serving import async_settings, serving
from transformers import TrainerCallback

from steadyrl import GRPOTrainer
from steadyrl.generation.server_client import ServerClient
from steadyrl.ops import completion_logprobs
from steadyrl.toy import toy_model_path
from steadyrl.trainers.grpo import GRPO

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def server():
    with serving(toy_model_path(), MAX_MODEL_LEN) as url:
        yield url


@pytest.fixture(scope="module")
def two_servers(server):
    """``server`` and a second one, as a run lists them (``vllm_server_base_url``): each samples every other row."""
    with serving(toy_model_path(), MAX_MODEL_LEN) as second:
        yield f"{server},{second}"


class Recorder(TrainerCallback):
    """The actor's weights before each step, and each rollout buffer trained on."""

    def __init__(self):
        self.trainer, self.weights, self.buffers = None, {}, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.weights[state.global_step] = {k: v.detach().clone() for k, v in self.trainer.model.state_dict().items()}

    def on_step_end(self, args, state, control, **kwargs):
        buffer = self.trainer.training_buffer.buffer
        if not self.buffers or self.buffers[-1][1] is not buffer:
            self.buffers.append((state.global_step, buffer))


@pytest.mark.parametrize("staleness", [1, 2])
def test_rollouts_are_sampled_with_older_weights_and_the_loss_corrects_with_the_sampling_logprobs(
    server, tmp_path, staleness
):
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path,
        algorithm="grpo",
        callbacks=[recorder],
        max_steps=12,
        save_steps=100,
        **async_settings(server, staleness),
    )
    recorder.trainer = trainer
    trainer.train()
    logs = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    # 4 steps a rollout: rollout r (trained from step 4r) was sampled with the weights of step 4 * max(0, r - s)
    lags = [logs[step]["async/staleness_steps"] for step in (1, 5, 9)]
    assert lags == [4 * min(r, staleness) for r in range(3)], lags
    assert all("async/trainer_wait_s" in logs[s] and "async/generator_wait_s" in logs[s] for s in (1, 5, 9))
    # The importance weight of each token is pi_trainer / pi_sampling: its denominator is the log-prob under the
    # weights the rollout was sampled with, not under the trainer's current ones.
    first_step, buffer = recorder.buffers[-1]  # the last rollout, sampled 4 * s steps before it was trained on
    rollout, sampled_at = buffer.rollout, first_step - 1 - 4 * staleness
    model = trainer.model
    current = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        model.load_state_dict(recorder.weights[sampled_at])
        with torch.no_grad():
            sampling, _ = completion_logprobs(model.eval(), *rollout.token_tensors, temperature=1.0)
    finally:
        model.load_state_dict(current)
    mask = rollout.completion_mask.bool() & (rollout.engine_weights < 100)  # not truncated
    implied = rollout.old_logprobs - rollout.engine_weights.log()  # log pi_trainer - log w = log pi_sampling
    assert (implied - sampling)[mask].abs().max() < 1e-4
    assert (rollout.old_logprobs - sampling)[mask].abs().max() > 1e-3, "the trainer's weights had not moved"


class SeparatePassGRPO(GRPO):
    checks_engine_in_loss = False  # a scoring pass for the sampling policy's log-probs, as before


class SeparatePass(GRPOTrainer):
    algorithm_class = SeparatePassGRPO


def test_a_rollout_trained_once_is_corrected_by_its_own_training_pass(server, tmp_path):
    """One optimizer step per rollout (2 micro-batches): no separate pass computes the trainer's log-probs of the
    sampled tokens; the training pass's own (detached) are checked against vLLM's and give the importance weights.
    The run equals one with the separate pass, while the lag moves the weights well away from 1."""
    one_step = dict(
        train_batch_size=8,
        micro_train_batch_size=4,
        num_ppo_epochs=1,
        max_steps=6,
        save_steps=100,
        learning_rate=1e-3,
        **async_settings(server, 1),
    )
    in_loss = make_trainer(tmp_path / "in-loss", algorithm="grpo", **one_step)
    in_loss.train()
    assert (
        in_loss.training_buffer.buffer.rollout.old_logprobs is None
        and in_loss.training_buffer.buffer.rollout.engine_logprobs is not None
    )
    separate = make_trainer(tmp_path / "separate", algorithm="grpo", trainer_cls=SeparatePass, **one_step)
    separate.train()
    assert separate.training_buffer.buffer.rollout.old_logprobs is not None
    ratio = "sampling/importance_sampling_ratio"
    lagged = [e for e in in_loss.state.log_history if e.get("async/staleness_steps", 0) > 0]
    assert lagged and max(max(e[f"{ratio}/max"] - 1, 1 - e[f"{ratio}/min"]) for e in lagged) > 0.05
    for a, b in zip(step_entries(in_loss.state.log_history), step_entries(separate.state.log_history), strict=True):
        for key in (f"{ratio}/min", f"{ratio}/max", "loss"):
            assert abs(a[key] - b[key]) < 1e-4 * max(1.0, abs(b[key])), (a["step"], key, a[key], b[key])
        for key in (f"{ratio}/mean", "generation_logprob_diff"):  # micro-batch means here, token means there
            assert abs(a[key] - b[key]) <= 0.05 * abs(b[key]) + 1e-6, (a["step"], key, a[key], b[key])
    for name, param in in_loss.model.named_parameters():  # Adam scales a ~1e-9 gradient up to ~lr: atol 2e-6
        torch.testing.assert_close(param, separate.model.get_parameter(name), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["rloo", "reinforce-pp"])
def test_rloo_and_reinforce_pp_train_ahead_with_a_token_level_loss(server, tmp_path, algorithm):
    trainer = make_trainer(
        tmp_path, algorithm=algorithm, loss_type="dapo", max_steps=8, save_steps=100, **async_settings(server, 1)
    )
    trainer.train()
    lags = [e["async/staleness_steps"] for e in trainer.state.log_history if "async/staleness_steps" in e]
    assert lags[0] == 0 and lags[-1] == 4
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


class StopAfter(TrainerCallback):
    """Ends training after global step ``step`` (its checkpoint written), as a run stopped there."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def test_distillation_trains_ahead_and_resumes_exactly(server, tmp_path):
    """Distillation's loss has no importance ratio (at each sampled prefix the student moves towards the teacher, as
    in TRL's AsyncDistillationTrainer): it generates ahead with max_staleness, uncorrected. A run stopped after
    checkpoint 4, which holds the rollout ahead, resumes to the uninterrupted run's weights."""
    from steadyrl.toy.task import build_model, build_tokenizer, toy_dataset

    teacher = tmp_path / "teacher"
    build_model(build_tokenizer(), seed=1).save_pretrained(teacher)
    build_tokenizer().save_pretrained(teacher)
    settings = dict(
        algorithm="distillation",
        model=toy_model_path(),
        teacher_model=str(teacher),
        train_dataset=toy_dataset(),
        use_vllm=True,
        vllm_dtype="float32",
        vllm_mode="server",
        vllm_server_base_url=server,
        max_staleness=1,
        max_steps=8,
        save_steps=4,
    )
    reference = make_trainer(tmp_path / "reference", **settings)
    reference.train()
    lags = [e["async/staleness_steps"] for e in reference.state.log_history if "async/staleness_steps" in e]
    assert lags[0] == 0 and max(lags) > 0, lags
    stopped = make_trainer(tmp_path / "resumed", callbacks=[StopAfter(4)], **settings)
    stopped.train()
    queue = json.loads((tmp_path / "resumed" / "checkpoint-4" / "rollouts_ahead_0.json").read_text())["queue"]
    assert len(queue) == 1, "the checkpoint holds the rollout requested ahead"
    resumed = make_trainer(tmp_path / "resumed", **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-4"))
    for name, param in resumed.model.named_parameters():
        assert torch.equal(param, reference.model.get_parameter(name)), name
    assert step_entries(resumed.state.log_history)[-1]["loss"] == step_entries(reference.state.log_history)[-1]["loss"]


SETTINGS = ["max_staleness=1", "max_steps=12", "save_steps=3"]


def run_async(out, server: str, processes: int, *flags, config=MULTI_CPU, extra=(), **kw):
    """``run_toy`` of an async GRPO run recording what it trains on, on ``processes`` processes (``config``: an
    accelerate config), in micro-batches that 1 and 2 processes can both run (a resume across keeps them);
    ``extra``: more settings."""
    launch = {"accelerate_config": config} if processes == 2 else {}
    batch = TWO_PROCESSES[1:]
    settings = [*batch, *ASYNC, f"vllm_server_base_url={server}", *SETTINGS, *extra]
    return run_toy(out, "--algorithm", "grpo", "--record-trained", *flags, "--set", *settings, **launch, **kw)


@pytest.fixture(scope="module")
def one_process(server, tmp_path_factory):
    """The uninterrupted async run on one process."""
    out = tmp_path_factory.mktemp("async-reference-1")
    run_async(out, server, 1)
    return out


def test_a_killed_async_run_resumes_exactly_on_one_and_two_processes_and_across(
    server, two_servers, one_process, tmp_path_factory
):
    """Generation ahead on 1 process with 1 server and on 2 processes with 2 servers (the main process generates
    every process's share, each server every other row): both train on the same prompts and completions at every
    step; SIGKILLed after a checkpoint taken with a rollout ahead, each resumes to its uninterrupted run's bytes, and on
    the other number of processes and servers within float32 rounding. What each step trained on is compared id by
    id: none of the peers' async-resume bugs (prompts skipped after a restore, NeMo-RL PR#3599; replayed, TRL PR#7294;
    a rollout in flight lost, verl PR#4199, OpenRLHF #1322)."""
    runs, servers = {}, {1: server, 2: two_servers}
    for processes in (1, 2):
        killed = tmp_path_factory.mktemp(f"async-killed-{processes}")
        if processes == 1:
            reference = one_process
        else:
            reference = tmp_path_factory.mktemp(f"async-reference-{processes}")
            run_async(reference, servers[processes], processes)
        run_async(killed, servers[processes], processes, "--kill-after-save", "6", expect_kill=True)
        queue = json.loads((killed / "checkpoint-6" / "rollouts_ahead_0.json").read_text())["queue"]
        assert [(len(q["prompt_ids"]), q["version"]) for q in queue] == [(8, 4)], "the rollout ahead, whole"
        if processes == 2:
            assert json.loads((killed / "checkpoint-6" / "rollouts_ahead_1.json").read_text()) == {"queue_length": 1}
            second = ServerClient(two_servers.split(",")[1], 30).claim_state()  # the killed run's claim is left
            assert second.get("weights"), f"the second server holds no weights of the run: {second}"
        across = tmp_path_factory.mktemp(f"async-across-{processes}")
        shutil.copytree(killed, across, dirs_exist_ok=True)
        run_async(killed, servers[processes], processes, "--resume")
        assert (killed / "final-actor" / "model.safetensors").read_bytes() == (
            reference / "final-actor" / "model.safetensors"
        ).read_bytes(), f"{processes} process(es): the resumed final weights differ"
        assert read_trained(killed) == read_trained(reference), "a resumed step trained on other samples"
        ref_logs, new_logs = read_logs(reference), read_logs(killed)
        for step in range(7, 13):
            for key in ref_logs[step]:
                if not key.startswith("async/") and "per_second" not in key:
                    assert new_logs[step][key] == ref_logs[step][key], f"step {step}: {key} differs"
        runs[processes] = reference, across
    (one, one_killed), (two, two_killed) = runs[1], runs[2]
    trained = read_trained(one)
    assert sorted(trained) == list(range(1, 13)) and read_trained(two) == trained, "1 and 2 processes train alike"
    assert_close_weights(two, one, rel=1e-4)  # Adam scales small gradients' rounding noise (a q_proj bias: 1.3e-5)
    copies = [entry["async/weight_copies_mb/max"] for entry in read_logs(two).values()]
    assert max(copies) > 0, "the main process holds the copy of the weights for the request not generated yet"
    for other, (out, reference) in ((2, (one_killed, one)), (1, (two_killed, two))):  # 1 -> 2, 2 -> 1 processes
        run_async(out, servers[other], other, "--resume")
        assert read_trained(out) == trained, f"resumed on {other}: a step trained on other samples"
        assert_close_weights(out, reference, rel=1e-4)


def test_partial_rollouts_span_three_weight_versions_resume_exactly_and_train_alike_on_two_processes(
    server, tmp_path_factory
):
    """partial_rollout_tokens=3 with max_staleness=2: each completion's first 3 tokens are generated ahead with the
    request's weights, 3 more at the next hand-over with the trainer's weights then, the rest at its own hand-over
    with the newest. SIGKILLed after checkpoint 6, which holds the rollouts ahead half-generated (their tokens,
    log-probs, seeds, versions, and which ended), the resumed run continues them to the uninterrupted run's bytes;
    2 processes train on the same prompt and completion ids."""
    reference, killed, two = (tmp_path_factory.mktemp(name) for name in ("partial", "partial-killed", "partial-two"))
    partial = ["max_staleness=2", "partial_rollout_tokens=3"]
    run_async(reference, server, 1, extra=partial)
    run_async(killed, server, 1, "--kill-after-save", "6", expect_kill=True, extra=partial)
    middle, heads = json.loads((killed / "checkpoint-6" / "rollouts_ahead_0.json").read_text())["queue"]
    assert (middle["version"], heads["version"]) == (0, 4) and len(heads["seeds"]) == 8
    assert any(len(ids) == 3 and not ended for ids, ended in zip(heads["completion_ids"], heads["stopped"]))
    assert [[0, 0], [3, 4]] in middle["versions"], "no completion was continued at the hand-over after its request"
    run_async(killed, server, 1, "--resume", extra=partial)
    assert (killed / "final-actor" / "model.safetensors").read_bytes() == (
        reference / "final-actor" / "model.safetensors"
    ).read_bytes(), "the resumed final weights differ"
    trained = read_trained(reference)
    assert read_trained(killed) == trained
    logs = read_logs(reference)
    assert all(0 < logs[step]["async/partial/fresh_token_share"] < 1 for step in logs), "no completion spans versions"
    assert logs[12]["async/staleness_steps"] == 8 and logs[12]["async/partial/versions_max"] == 3
    run_async(two, server, 2, extra=partial)
    assert read_trained(two) == trained
    assert_close_weights(two, reference, rel=1e-4)


@pytest.mark.parametrize("engine", ["zero2", "fsdp2"])
def test_generation_ahead_on_two_processes_under_zero2_and_fsdp2(server, two_servers, one_process, tmp_path, engine):
    """The weights of a sharded actor are gathered to the main process for its copy; the run trains on the same
    samples as one process does. Evaluating every 2 steps (FSDP2, on 2 servers) pushes the current weights to both
    servers from every process alike, although they hold a copy pushed since, and changes nothing the training
    samples."""
    evaluating = ["--eval-prompts", "4"] if engine == "fsdp2" else []
    config, url = (ZERO["zero2"], server) if engine == "zero2" else (CONFIGS / "fsdp2.yaml", two_servers)
    run_async(tmp_path, url, 2, *evaluating, config=config)
    assert read_trained(tmp_path) == read_trained(one_process)
    if evaluating:
        assert [step for step, entry in read_logs(tmp_path).items() if "eval_reward" in entry] == [2, 4, 6, 8, 10, 12]
    assert_close_weights(tmp_path, one_process, rel=1e-4)  # the engines sum gradients in another order


def test_a_stream_read_ahead_resumes_at_its_next_row(server, tmp_path_factory):
    """A streaming dataset read ahead (the rollout requested ahead drew its rows before the checkpoint) resumes at the
    row after the last one drawn, not at the stream's first (TRL's AsyncGRPO restarts a stream from prompt 0 on
    resume): the resumed run trains on the same rows, to the same bytes, as the uninterrupted one."""
    data_dir = tmp_path_factory.mktemp("stream-data")
    write_prompt_files(data_dir)
    settings = ["algorithm=grpo", *ASYNC, f"vllm_server_base_url={server}", *SETTINGS]
    runs = [tmp_path_factory.mktemp(f"stream-{name}") for name in ("reference", "resumed")]
    commands = [[], ["--kill-after-save", "3"], ["--resume"]]  # after 2 draws: rows 0-3, 4-5 and 0-1 (wrapped)
    for out, flags in zip([runs[0], runs[1], runs[1]], commands):
        command = [sys.executable, str(ROOT / "tests" / "support" / "stream_run.py"), str(out), str(data_dir), *flags]
        proc = subprocess.run([*command, "--set", *settings], capture_output=True, text=True, timeout=600)
        assert proc.returncode == (-9 if "--kill-after-save" in flags else 0), (proc.stdout + proc.stderr)[-3000:]
    reference, resumed = ((out / "final-actor" / "model.safetensors").read_bytes() for out in runs)
    assert resumed == reference
    drawn = [[json.loads(line)["prompts"] for line in (out / "prompts-0.jsonl").open()] for out in runs]
    assert drawn[1] == drawn[0] and len(drawn[0]) == 4, "the resumed run draws rows 2-5 next, as the reference does"
    assert drawn[0][2] != drawn[0][0], "a stream restarted at its first row would draw other prompts"


@pytest.mark.reliability
@pytest.mark.parametrize(
    "algorithm, extra",
    [
        # 4 steps a rollout: a separate pass for the sampling policy's log-probs; partial rollouts (heads of 3 tokens
        # ahead, tails at the hand-over): kills also land with completions half-generated
        ("grpo", ["max_staleness=1", "partial_rollout_tokens=3"]),
        # one step a rollout, two ahead: the training pass corrects with its own log-probs
        ("rloo", ["max_staleness=2", "loss_type=dapo", "beta=0.0", "train_batch_size=8", "num_ppo_epochs=1"]),
    ],
)
def test_crash_fuzzing_an_async_run(server, tmp_path, algorithm, extra):
    settings = ["save_steps=1", "save_total_limit=2", "max_steps=8", *ASYNC, f"vllm_server_base_url={server}", *extra]
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "support" / "crash_fuzz.py"),
        str(tmp_path),
        "--algorithm",
        algorithm,
        "--kills",
        "6",
        "--seed",
        "0",
        "--set",
        *settings,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    events = json.loads((tmp_path / "report.json").read_text())["events"]
    assert sum(event["killed"] for event in events) == 6, events
    assert any(event["mode"] == "in-save" and event["killed"] for event in events), "no kill hit a checkpoint write"


def test_dynamic_sampling_draws_ahead(server, tmp_path):
    """With max_staleness, each draw of dynamic sampling is a rollout's worth of prompts generated ahead: the next
    draws are in flight while the last is scored, and every rollout is filled with groups whose rewards differ."""
    trainer = make_trainer(
        tmp_path,
        algorithm="grpo",
        reward_funcs="half_constant",
        dynamic_sampling=True,
        max_steps=8,
        save_steps=100,
        **async_settings(server, 1),
    )
    trainer.train()
    logs = {entry["step"]: entry for entry in step_entries(trainer.state.log_history)}
    draws = [logs[step]["dynamic_sampling/draws"] for step in (1, 5)]
    assert min(draws) >= 2 and trainer.prompt_draw.draws >= sum(draws) + 1, draws  # + the draw requested ahead
    assert all(logs[step]["frac_reward_zero_std"] == 0.0 for step in logs)
    assert logs[5]["async/staleness_steps"] > 0
