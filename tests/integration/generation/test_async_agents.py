"""max_staleness with tools and environments: the tool-call loop of a rollout requested ahead runs on the main
process's worker thread, every turn sampled with the copy of the weights of the step it was requested at. A run
killed at any moment, inside a tool call too, resumes to the uninterrupted run's bytes, on 2 processes, and on
another number of processes within float32 rounding."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import ASYNC, MULTI_CPU, ROOT, TWO_PROCESSES, assert_close_weights, read_logs, run_toy
from support.toy_run import read_trained
from support.vllm_serving import serving

from steadyrl.toy.tools import tool_model_path


@pytest.fixture(scope="module")
def server():
    with serving(tool_model_path(), 512) as url:
        yield url


def settings(server: str) -> list[str]:
    """An environment run (the tool fixture's ``Calculator``) ahead on the server, in micro-batches that 1 and 2
    processes can both run."""
    return [*TWO_PROCESSES[1:], *ASYNC, "max_staleness=1", f"vllm_server_base_url={server}"]


def run_agents(out, server: str, processes: int, *flags, **kw):
    launch = {"accelerate_config": MULTI_CPU} if processes == 2 else {}
    run = ["--algorithm", "grpo", "--tools", "environment", "--record-trained", *flags]
    return run_toy(out, *run, "--set", *settings(server), "max_steps=12", "save_steps=3", **launch, **kw)


def test_an_agent_run_ahead_killed_inside_a_tool_call_resumes_exactly_on_two_processes_and_on_one(
    server, tmp_path_factory
):
    """The environment's tool SIGKILLs the driver inside its first call after checkpoint 3: a trajectory of the
    rollout generated ahead was between two turns. Resumed on 2 processes: the uninterrupted run's final bytes, and
    every step trained on the same prompt and completion ids (the environment's tokens among them). 1 and 2
    processes train on the same samples; resumed on 1 process, the same samples and weights within rounding."""
    one, two, killed = (tmp_path_factory.mktemp(name) for name in ("agents-one", "agents-two", "agents-killed"))
    run_agents(one, server, 1)
    run_agents(two, server, 2)
    run_agents(killed, server, 2, "--kill-in-tool", "3", expect_kill=True)
    assert not (killed / "checkpoint-6").exists(), "killed in the tool call after checkpoint 3"
    queue = json.loads((killed / "checkpoint-3" / "rollouts_ahead_0.json").read_text())["queue"]
    assert len(queue) == 1 and queue[0]["version"] == 0, "the rollout generated ahead, whole, with its environment"
    assert any(0 in mask for mask in queue[0]["env_mask"]), "the tool results' tokens are marked as the environment's"
    across = tmp_path_factory.mktemp("agents-across")
    shutil.copytree(killed, across, dirs_exist_ok=True)
    run_agents(killed, server, 2, "--resume")
    assert (killed / "final-actor" / "model.safetensors").read_bytes() == (
        two / "final-actor" / "model.safetensors"
    ).read_bytes(), "the resumed final weights differ"
    trained = read_trained(one)
    assert sorted(trained) == list(range(1, 13))
    assert read_trained(two) == trained and read_trained(killed) == trained, "a step trained on other samples"
    logs = read_logs(two)
    assert all(logs[step]["tools/call_frequency"] > 0 for step in logs), "a rollout without tool calls"
    assert logs[12]["async/staleness_steps"] == 4, "rollouts sampled with the weights of one rollout back"
    assert_close_weights(two, one, rel=1e-4)
    run_agents(across, server, 1, "--resume")  # 2 -> 1 processes
    assert read_trained(across) == trained
    assert_close_weights(across, one, rel=1e-4)


@pytest.mark.reliability
def test_crash_fuzzing_an_agent_run_ahead_on_two_processes(server, tmp_path):
    """The whole launch SIGKILLed at seeded random moments (in a tool call or between turns on the worker, pushing
    weights, training, writing a checkpoint), resumed after each: the same final bytes and logged values as the
    uninterrupted launch."""
    cmd = [sys.executable, str(ROOT / "tests" / "support" / "crash_fuzz_launched.py"), str(tmp_path)]
    cmd += ["--config", str(MULTI_CPU), "--kills", "4", "--seed", "0", "--"]
    cmd += ["--algorithm", "grpo", "--tools", "environment", "--set", *settings(server)]
    cmd += ["max_steps=12", "save_steps=1", "save_total_limit=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    events = json.loads((tmp_path / "report.json").read_text())["events"]
    assert sum(not event["finished_first"] for event in events) >= 3, events
