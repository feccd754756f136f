"""Two processes under ``accelerate launch`` (gloo on CPU), with DDP and with DeepSpeed ZeRO-2 and ZeRO-3:
checkpoints, exact resume, agreement between the engines, export of a sharded run, and what is refused."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from conftest import MULTI_CPU, ROOT, TWO_PROCESSES, ZERO, free_port, read_logs, run_toy, toy_command

from integration.resume.test_resume import assert_same_result, assert_trains_as
from steadyrl.checkpoint import find_resumable_checkpoint
from steadyrl.ops import leave_one_out_advantages, whiten
from steadyrl.trainers.loop.preemption import LAUNCHER_ENV


@pytest.fixture(scope="module")
def uninterrupted(ddp_runs):
    return ddp_runs("rloo")


def test_checkpoints_land_at_multiples_of_save_steps_with_every_process_state(uninterrupted):
    assert sorted(p.name for p in uninterrupted.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (12, 3, 6, 9)]
    names = {p.name for p in (uninterrupted / "checkpoint-6").iterdir()}
    for rank in (0, 1):  # checkpoint 6 falls mid-rollout: each process saved its own share of it
        assert {f"rng_state_{rank}.json", f"meter_{rank}.json", f"rollout_buffer_{rank}.safetensors"} <= names
    assert sorted(read_logs(uninterrupted)) == list(range(1, 13))


def test_sigkill_of_the_launch_after_a_checkpoint_resumes_identically(uninterrupted, tmp_path):
    run_toy(tmp_path, "--kill-after-save", "6", *TWO_PROCESSES, expect_kill=True, accelerate_config=MULTI_CPU)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    _, output = run_toy(tmp_path, "--resume", *TWO_PROCESSES, accelerate_config=MULTI_CPU)
    assert output.count("Resuming from") == 2 and "checkpoint-6" in output, "both processes resume from step 6"
    assert_same_result(uninterrupted, tmp_path, after_step=6)


def test_a_signal_to_one_process_stops_all_at_the_same_step_with_a_checkpoint(tmp_path, toy_path):
    # only the main process gets SIGTERM, as step 5 begins; both finish step 5, save checkpoint-5 and exit with 143,
    # which the launcher reports as a failure of its workers (non-zero: a scheduler restarts the job)
    _, output = run_toy(tmp_path, "--signal-at", "4", *TWO_PROCESSES, accelerate_config=MULTI_CPU, expect_failure=True)
    assert "Stopped by SIGTERM after step 5" in output and "Stopped by a signal on another process" in output
    assert "exitcode  : 143" in output, output[-3000:]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-5"]
    names = {p.name for p in (tmp_path / "checkpoint-5").iterdir()}
    assert {"meter_0.json", "meter_1.json", "rng_state_0.json", "rng_state_1.json"} <= names


class Launch:
    """support/toy_run.py under ``accelerate launch`` with 2 CPU processes, its output read as it comes, and its two
    workers (the elastic agent's children, each in a session of its own); ``close`` kills whatever is left."""

    def __init__(self, output_dir, *flags, overrides=()) -> None:
        cmd = toy_command(output_dir, *flags, *TWO_PROCESSES, *overrides, accelerate_config=MULTI_CPU)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.output = ""
        launcher, deadline = psutil.Process(self.proc.pid), time.monotonic() + 60
        while len(launcher.children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        self.workers = launcher.children()
        assert len(self.workers) == 2, self.workers

    def read_until(self, text: str) -> None:
        for line in self.proc.stdout:
            self.output += line
            if text in line:
                return
        raise AssertionError(f"the run ended before {text!r}:\n{self.output[-3000:]}")

    def wait(self, timeout: float) -> int:
        """The launcher's exit status, once it and both workers are gone (within ``timeout`` seconds in all)."""
        self.output += self.proc.communicate(timeout=timeout)[0]
        gone, alive = psutil.wait_procs(self.workers, timeout=5)
        assert not alive, f"workers left alive: {alive}"
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for worker in self.workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()


def test_sigterm_to_the_launcher_stops_every_worker_after_a_step_with_a_checkpoint(tmp_path, toy_path):
    # torch's elastic agent forwards the SIGTERM it gets to each worker and SIGKILLs them 30 s later if they are still
    # there. As SLURM signals every process of a job, one worker also gets its own SIGTERM, just before the launcher:
    # the launcher's copy, arriving as that worker finishes its step, is not a second signal (which would end it at
    # once, without a checkpoint).
    launch = Launch(tmp_path, overrides=["max_steps=200"])
    try:
        launch.read_until("'loss'")  # a logged step: training is under way
        os.kill(launch.workers[1].pid, signal.SIGTERM)
        launch.read_until("Received SIGTERM")
        launch.proc.send_signal(signal.SIGTERM)
        launch.wait(timeout=120)
    finally:
        launch.close()
    # the main process may learn of worker 1's signal from the end-of-step agreement before the launcher's copy of
    # the signal reaches it: then it says so
    stopped = r"Stopped by (?:SIGTERM|a signal on another process) after step (\d+): checkpoint-\1 is in"
    steps = re.findall(stopped, launch.output)
    assert len(steps) == 2 and steps[0] == steps[1], launch.output[-3000:]
    assert "The launcher SIGKILLs its workers" in launch.output  # and how long it waits
    assert find_resumable_checkpoint(tmp_path) == tmp_path / f"checkpoint-{steps[0]}"  # complete: its manifest holds
    assert not list(tmp_path.glob("tmp-checkpoint-*"))


def test_under_a_launcher_a_repeated_signal_within_the_window_is_the_same_one():
    code = (
        "import os, signal\n"
        "from steadyrl.trainers.loop.preemption import StopSignals\n"
        "with StopSignals() as stop:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"  # outside a launcher, the process would end here (status -15)
        "print('received', stop.received)\n"
    )
    env = {**os.environ, LAUNCHER_ENV: "test"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "received 15" in proc.stdout, proc.stderr[-3000:]


def test_a_save_failing_on_one_process_stops_both_at_once_and_resume_uses_the_last_checkpoint(uninterrupted, tmp_path):
    # process 1's part of checkpoint-6 fails as a full disk would; without an agreement the main process would wait
    # at a barrier until the process group's timeout (30 minutes)
    launch = Launch(tmp_path, "--fail-save", "1:6")
    try:
        status = launch.wait(timeout=120)
    finally:
        launch.close()
    output = launch.output
    assert status != 0
    assert "CheckpointError: Process 1 of 2: Could not write the checkpoint" in output, output[-3000:]
    assert "No space left on device" in output
    assert "(CheckpointError: process 1 could not write its part of it; that process's error says why)" in output
    assert "the newest complete checkpoint" in output and "checkpoint-3, is intact" in output
    assert sorted(p.name for p in tmp_path.iterdir() if "checkpoint" in p.name) == ["checkpoint-3"]
    _, output = run_toy(tmp_path, "--resume", *TWO_PROCESSES, accelerate_config=MULTI_CPU)
    assert output.count("Resuming from") == 2 and "checkpoint-3" in output
    assert_same_result(uninterrupted, tmp_path, after_step=3)


FAULTS = """
import errno, sys
sys.path.insert(0, sys.argv[3])
from support.toy_run import make_trainer
from steadyrl.checkpoint import checkpointer as checkpointing

output_dir, fault = sys.argv[1], sys.argv[2]
trainer = make_trainer(output_dir, micro_rollout_batch_size=4, micro_train_batch_size=1, save_steps=3,
                       save_total_limit=1, max_steps=3 if fault == "rotation" else 6)
rank = trainer.accelerator.process_index
if fault == "rotation" and rank == 0:
    def rotate_checkpoints(directory, limit):
        raise PermissionError(errno.EACCES, "Permission denied", directory)
    checkpointing.rotate_checkpoints = rotate_checkpoints
if fault == "load" and rank == 1:
    def load(directory, contents):
        raise OSError(errno.EIO, "Input/output error", str(directory / "meter_1.json"))
    trainer.checkpointer._load = load
trainer.train(resume_from_checkpoint=fault == "load" or None)
"""


def launch_with_fault(output_dir, fault: str) -> str:
    """FAULTS under ``accelerate launch`` with 2 processes; the output of a run that must fail within 3 minutes (a
    process left waiting for the failed one would wait for the process group's timeout: 30 minutes)."""
    script = output_dir.parent / "faults.py"
    script.write_text(FAULTS)
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(MULTI_CPU)]
    cmd = [*launcher, "--main_process_port", str(free_port()), str(script), str(output_dir), fault, str(ROOT / "tests")]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            child.kill()
        proc.kill()
    assert proc.returncode != 0, output[-3000:]
    return output


def test_a_rotation_or_load_failing_on_one_process_stops_both_at_once(tmp_path, toy_path):
    """Rotation runs on the main process alone, and a checkpoint load can fail on one process: every process
    raises at once."""
    run = tmp_path / "run"
    output = launch_with_fault(run, "rotation")  # after checkpoint-3 is committed
    assert (
        output.count(
            "CheckpointError: checkpoint-3 is complete, but deleting the checkpoints beyond save_total_limit=1"
        )
        >= 2
    ), output[-3000:]
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint-3"]
    output = launch_with_fault(run, "load")  # resuming from checkpoint-3: process 1 cannot read its state
    assert "Input/output error" in output, output[-3000:]
    assert f"CheckpointError: Loading {run / 'checkpoint-3'} failed on process 1; that process's error" in output


def test_a_two_process_run_resumes_on_one_process_and_trains_what_it_would_have(uninterrupted, tmp_path):
    """checkpoint-6 falls mid-rollout: the rest of that rollout's mini-batches, the prompts, seeds and completions
    after it are the two-process run's, and the change is logged."""
    import shutil

    shutil.copytree(uninterrupted / "checkpoint-6", tmp_path / "checkpoint-6")
    _, output = run_toy(tmp_path, "--resume", *TWO_PROCESSES)
    assert "world_size 2 -> 1" in output, output[-3000:]
    assert_trains_as(uninterrupted, tmp_path, after_step=6)


def test_a_one_process_run_resumes_on_two_processes_and_trains_what_it_would_have(tmp_path):
    import shutil

    one, two = tmp_path / "one", tmp_path / "two"
    run_toy(one, *TWO_PROCESSES)
    shutil.copytree(one / "checkpoint-6", two / "checkpoint-6")
    _, output = run_toy(two, "--resume", *TWO_PROCESSES, accelerate_config=MULTI_CPU)
    assert "world_size 1 -> 2" in output, output[-3000:]
    assert_trains_as(one, two, after_step=6)


def test_vllm_under_zero3_generates_with_the_gathered_actor_and_keeps_the_process_group(tmp_path):
    # REINFORCE++'s run (RLOO runs vLLM under ZeRO-3 in generation/test_vllm_lora.py)
    vllm = ["use_vllm=true", "vllm_dtype=float32", "max_steps=6"]
    run_toy(tmp_path, "--algorithm", "reinforce-pp", *TWO_PROCESSES, *vllm, accelerate_config=ZERO["zero3"])
    logs = read_logs(tmp_path)
    assert sorted(logs) == list(range(1, 7))
    for step, entry in logs.items():  # vLLM's log-probs of its samples are the trainer's: the push was whole
        assert entry["generation_logprob_diff"] < 1e-4, step
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert (tmp_path / "final-actor" / "model.safetensors").is_file()  # saved after train(), with the engine up


@pytest.mark.parametrize(
    "zero_config, flags, message",
    [
        ("zero_stage: 2\n  offload_optimizer_device: cpu", [], "ZeRO stage 2 with offload is not supported"),
    ],
    ids=["offload-under-zero2"],
)
def test_unsupported_deepspeed_settings_are_refused_before_any_work(tmp_path, zero_config, flags, message):
    config = tmp_path / "deepspeed.yaml"
    config.write_text(
        f"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  {zero_config}\n"
        "num_machines: 1\nnum_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\n"
    )
    _, output = run_toy(tmp_path / "out", *flags, *TWO_PROCESSES, accelerate_config=config, expect_failure=True)
    assert message in output
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_evaluation_and_completion_logs_cover_every_process(tmp_path, toy_path):
    import json

    # 5 held-out prompts over 2 processes: 3 each, the repeated one left out of the metrics. The advantages are
    # whitened (beta 0: each is the score's leave-one-out advantage) over the whole rollout, not each process's half.
    settings = [
        *TWO_PROCESSES[1:],
        "log_completions=true",
        "num_generations_eval=2",
        "normalize_advantages=true",
        "beta=0",
    ]  # one --set for all
    run_toy(tmp_path, "--eval-prompts", "5", accelerate_config=MULTI_CPU, overrides=settings)
    logs = json.loads((tmp_path / "log_history.json").read_text())
    evals = [e for e in logs if "eval_reward" in e]
    assert [e["step"] for e in evals] == [2, 4, 6, 8, 10, 12]
    lengths = [e["eval_completions/mean_length"] for e in evals]
    assert all(0 < length <= 8 for length in lengths)
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [step for step in (1, 5, 9) for _ in range(8)], "8 samples a rollout"
    for first in range(0, len(lines), 8):  # what one process computes from the whole rollout (both processes' rows)
        rollout = lines[first : first + 8]
        rewards = torch.tensor([line["reward"] for line in rollout])
        expected = whiten(leave_one_out_advantages(rewards, k=2))
        advantages = torch.tensor([line["advantage"] for line in rollout])
        torch.testing.assert_close(advantages, expected, rtol=1e-5, atol=1e-5)


def test_a_failing_hub_push_stops_no_process(tmp_path, toy_path, monkeypatch):
    """The first push (the main process's, at checkpoint-3) fails: the main process still reaches the barrier the
    other one waits at after each save, both train to the end, and checkpoint-6 is pushed."""
    from support.hub_server import start

    hub, server = start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub.fail_next(1, 500, path="/api/repos/create", after=1)  # the first one is the trainer's, as it is built
    push = ["push_to_hub=true", "hub_strategy=every_save", "hub_model_id=someone/ddp", "hub_token=hf_x", "max_steps=6"]
    try:
        _, output = run_toy(tmp_path, *TWO_PROCESSES, *push, accelerate_config=MULTI_CPU)
    finally:
        server.shutdown()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert output.count("Could not push the actor of step 3 to the Hub repository 'someone/ddp'") == 1
    assert "Hub push recovered: step 3 failed, step 6 pushed to 'someone/ddp'" in output
    assert [c.message for c in hub.commits] == ["Training in progress, step 6", "Model save"]


def test_an_error_in_a_checkpoint_push_stops_every_process_with_its_cause(tmp_path, toy_path):
    # not the Hub's failure (those are reported and training goes on) but a bug on the main process: the other
    # process must not wait at the next collective, and must say why it stops
    _, output = run_toy(tmp_path, "--fail-push", "3", *TWO_PROCESSES, accelerate_config=MULTI_CPU, expect_failure=True)
    assert output.count("RuntimeError: injected failure in the push of step 3") >= 2, output[-3000:]
    assert "[rank1]: RuntimeError: injected failure in the push of step 3" in output, output[-3000:]


def test_dynamic_sampling_trains_the_same_groups_on_two_processes_as_on_one(tmp_path, toy_path):
    """The keep/drop decision is each group's, the fill-up global: both processes draw until the rollout's 4 groups
    whose rewards differ are kept, and train the first 4 in draw order, each its 2; one process trains the same ones.
    The reward is constant for half the prompts (toy_run.half_constant_reward), so which groups are kept depends on
    the prompts alone, not on the completions (HF generate samples differently on one process). The reward function
    logs a metric on the first process only: it is logged under its name, and the others under theirs."""
    import json

    reward = "reward_funcs=half_constant_logging_on_0"
    settings = [*TWO_PROCESSES[1:], reward, "dynamic_sampling=true", "log_completions=true"]
    settings += ["max_steps=8", "save_steps=8"]
    runs = {"one": tmp_path / "one", "two": tmp_path / "two"}
    run_toy(runs["one"], "--algorithm", "grpo", overrides=settings)
    run_toy(runs["two"], "--algorithm", "grpo", accelerate_config=MULTI_CPU, overrides=settings)
    trained, counts = {}, {}
    for name, path in runs.items():
        lines = [json.loads(line) for line in (path / "completions.jsonl").read_text().splitlines()]
        trained[name] = [(line["step"], line["prompt"]) for line in lines]
        logs = read_logs(path)
        counts[name] = [{k: v for k, v in logs[step].items() if k.startswith("dynamic_sampling/")} for step in logs]
    assert [step for step, _ in trained["two"]] == [step for step in (1, 5) for _ in range(8)], "8 samples a rollout"
    assert trained["two"] == trained["one"]
    assert all(prompt[0] >= "n" for _, prompt in trained["two"])
    assert counts["two"] == counts["one"] and counts["one"][0]["dynamic_sampling/draws"] >= 2, counts
    for entry in read_logs(runs["two"]).values():  # by name: the other process's metrics do not shift onto it
        assert entry["logged_on_process_0"] == 100.0 and 0 <= entry["reward"] < 1, entry
