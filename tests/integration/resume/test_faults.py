"""Faults a long run meets (docs/faults.md), tried for real on the toy RLOO run: a reward function that hangs, sync or
async, with and without reward_timeout, and a stop signal during the hang; a reward service that answers errors or
refuses connections for a while. The run goes on, or stops with a message that names the function (the service), the
step and what to do; every checkpoint on disk stays loadable; and the same command resumes it to the uninterrupted
run's weights, byte for byte. (A full disk: test_reliability.py::test_really_full_filesystem.)"""

import asyncio
import json
import logging
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch
from conftest import run_entries
from support.plain_http import reward_service
from support.toy_run import make_trainer
from transformers import TrainerCallback

from steadyrl import RewardFunctionError, reward_watch
from steadyrl.checkpoint import scan_checkpoints, verify_checkpoint
from steadyrl.toy import letters_reward

# toy_run's defaults (4 steps a rollout, save_steps=3) but 8 steps: the second rollout is scored at global step 4,
# when checkpoint-3 (in the middle of the first rollout) is the newest.
RUN = dict(max_steps=8)
FAULT_AT = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its final weights and its losses and rewards by step."""
    trainer = make_trainer(tmp_path_factory.mktemp("faults-reference"), **RUN)
    trainer.train()
    return weights_of(trainer), curves_of(trainer)


def weights_of(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.state_dict().items()}


def curves_of(trainer) -> dict[int, tuple[float, float]]:
    return {e["step"]: (e["loss"], e["reward"]) for e in trainer.state.log_history if "loss" in e}


def assert_resumes_to_the_reference(output_dir, reference, reward_func, **settings) -> None:
    """The same command with resume_from_checkpoint=True ends with the uninterrupted run's weights, byte for byte,
    and its losses and rewards at every step."""
    trainer = make_trainer(output_dir, reward_funcs=[reward_func], **RUN, **settings)
    trainer.train(resume_from_checkpoint=True)
    weights, curves = reference
    for name, tensor in weights_of(trainer).items():
        assert torch.equal(tensor, weights[name]), f"{name} differs from the uninterrupted run"
    assert curves_of(trainer) == curves


def assert_loadable_checkpoints(output_dir, names: list[str]) -> None:
    """Exactly ``names`` are on disk, each complete and loadable (nothing half-written left)."""
    assert run_entries(output_dir) == names
    scan = scan_checkpoints(output_dir)
    assert not scan.rejected
    for name in names:
        verify_checkpoint(output_dir / name)


# ---- a reward function that hangs ----------------------------------------------------------------------------------


class Hang:
    """When armed, the reward functions below hang once, as they score the rollout at FAULT_AT, for ``seconds``."""

    def __init__(self) -> None:
        self.armed, self.seconds, self.started = False, 3600.0, threading.Event()

    def due(self, trainer_state) -> bool:
        if self.armed and trainer_state.global_step == FAULT_AT:
            self.armed = False
            self.started.set()
            return True
        return False


HANG = Hang()


def hanging_letters(completions, letters, trainer_state, **kwargs):
    if HANG.due(trainer_state):
        time.sleep(HANG.seconds)
    return letters_reward(completions=completions, letters=letters)


async def async_hanging_letters(completions, letters, trainer_state, **kwargs):
    if HANG.due(trainer_state):
        await asyncio.sleep(HANG.seconds)
    return letters_reward(completions=completions, letters=letters)


FUNCS = {"sync": hanging_letters, "async": async_hanging_letters}


@pytest.fixture
def hang(monkeypatch, caplog):
    """HANG armed; a call counts as hung after 0.3 s (reward_watch.HANG_WARNING_S); warnings captured."""
    monkeypatch.setattr(reward_watch, "HANG_WARNING_S", 0.3)
    HANG.armed, HANG.seconds, HANG.started = True, 3600.0, threading.Event()
    caplog.set_level(logging.WARNING)
    yield HANG
    HANG.armed = False


def signal_during_the_hang(signum: int, after: float) -> None:
    """Send this process ``signum`` ``after`` seconds into the hang, as a scheduler or Ctrl-C does."""

    def send() -> None:
        if HANG.started.wait(120):
            time.sleep(after)
            os.kill(os.getpid(), signum)

    threading.Thread(target=send, daemon=True).start()


@pytest.mark.parametrize(
    "kind, signum, after",
    [
        ("sync", signal.SIGTERM, 1.0),  # past the threshold (0.3 s; warned about at 0.3 and 0.6): interrupted at once
        ("async", signal.SIGINT, 1.0),
        ("sync", signal.SIGTERM, 0.0),  # before it: the call may still return; it is interrupted at the threshold
    ],
    ids=["sync-SIGTERM-past-threshold", "async-SIGINT-past-threshold", "sync-SIGTERM-before-threshold"],
)
def test_a_stop_signal_ends_a_hanging_reward_function_and_the_run_resumes(
    reference, tmp_path, hang, caplog, monkeypatch, kind, signum, after
):
    """Without reward_timeout a hang is warned about (the function, the step, the time, the line it is at); SIGTERM
    or SIGINT interrupts it and stops the run with the status of a stopped run, checkpoint-3 intact."""
    if after == 0.0:  # a threshold the signal surely comes before, on a loaded machine too
        monkeypatch.setattr(reward_watch, "HANG_WARNING_S", 1.0)
    signal_during_the_hang(signum, after)
    with pytest.raises(SystemExit) as stopped:
        make_trainer(tmp_path, reward_funcs=[FUNCS[kind]], **RUN).train()
    assert stopped.value.code == 128 + signum
    name, messages = FUNCS[kind].__name__, caplog.text
    assert (
        f"Received {signal.Signals(signum).name} while {'async ' * (kind == 'async')}reward function '{name}' had run"
        in messages
    )
    assert f"without returning at global step {FAULT_AT}: it was interrupted, and the run stops now" in messages
    assert "run again with resume_from_checkpoint=True" in messages
    if after > reward_watch.HANG_WARNING_S:  # warned about before the signal
        assert re.search(rf"reward function '{name}' has been running for 0\.\d s at global step {FAULT_AT}", messages)
        assert "stop the run with SIGTERM / SIGINT (Ctrl-C)" in messages
        if kind == "sync":  # the line it is stuck at
            assert f"test_faults.py:{hanging_letters.__code__.co_firstlineno + 2} in hanging_letters" in messages
    else:
        assert f"reward function '{name}' is running: if it returns within 1 s of its start" in messages
    assert_loadable_checkpoints(tmp_path, ["checkpoint-3"])
    assert_resumes_to_the_reference(tmp_path, reference, FUNCS[kind])


def test_a_stop_signal_lets_a_slow_reward_function_finish_its_step(reference, tmp_path, hang, caplog, monkeypatch):
    """A call slower than usual but under the threshold is not taken for a hang: the step finishes and is
    checkpointed, as for any stop signal."""
    HANG.seconds = 1.0
    monkeypatch.setattr(reward_watch, "HANG_WARNING_S", 5.0)
    signal_during_the_hang(signal.SIGTERM, 0.0)
    with pytest.raises(SystemExit) as stopped:
        make_trainer(tmp_path, reward_funcs=[hanging_letters], **RUN).train()
    assert stopped.value.code == 143
    assert "reward function 'hanging_letters' is running: if it returns within 5 s" in caplog.text
    assert f"Stopped by SIGTERM after step {FAULT_AT + 1}" in caplog.text
    assert_loadable_checkpoints(tmp_path, ["checkpoint-3", f"checkpoint-{FAULT_AT + 1}"])
    assert_resumes_to_the_reference(tmp_path, reference, hanging_letters)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_reward_timeout_ends_a_hanging_reward_function_and_the_run_resumes(reference, tmp_path, hang, kind):
    """With reward_timeout a synchronous function is interrupted (on the main thread), an async one cancelled; the
    run stops with an error that names the function, the step and what to do."""
    with pytest.raises(RewardFunctionError) as failed:
        make_trainer(tmp_path, reward_funcs=[FUNCS[kind]], reward_timeout=0.5, **RUN).train()
    message = str(failed.value)
    assert f"reward function '{FUNCS[kind].__name__}' did not return within reward_timeout=0.5 seconds" in message
    assert f"at global step {FAULT_AT}:" in message
    assert "run the same command with resume_from_checkpoint=True" in message
    assert_loadable_checkpoints(tmp_path, ["checkpoint-3"])
    assert_resumes_to_the_reference(tmp_path, reference, FUNCS[kind], reward_timeout=0.5)


def test_off_the_main_thread_a_hanging_call_is_warned_about_not_interrupted(monkeypatch, caplog):
    """max_staleness scores on a worker thread, where a synchronous call cannot be interrupted (nor held to
    reward_timeout): it is warned about, and returns when it returns."""
    from steadyrl.rewards import RewardInputs, score_completions

    def slow(completions, **kwargs):
        time.sleep(0.6)
        return [1.0] * len(completions)

    inputs = RewardInputs(["p:"], ["ab"], [[1, 2]], {}, [[0]], ["p:"], ["ab"])
    monkeypatch.setattr(reward_watch, "HANG_WARNING_S", 0.2)
    caplog.set_level(logging.WARNING)
    scores = []
    worker = threading.Thread(target=lambda: scores.append(score_completions([slow], inputs, timeout=0.2)))
    worker.start()
    worker.join(30)
    assert scores and scores[0].tolist() == [[1.0]], "the call was not left to return"
    assert re.search(r"reward function 'slow' has been running for 0\.\d s \(it is at \S+test_faults.py", caplog.text)
    assert "steadyrl cannot interrupt a synchronous function here (off the main thread" in caplog.text


# ---- a reward service that answers errors --------------------------------------------------------------------------

SERVICE = {"url": None}
RETRY_WAITS_S = [0.05, 0.1, 0.2, 0.4, 0.8]  # the docs' recipe waits 1, 2, 4, 8, 16 s


def remote_letters(completions, letters, **kwargs):
    """The toy reward, computed by the service; a failed request fails the call."""
    body = json.dumps({"completions": completions, "letters": letters}).encode()
    with urllib.request.urlopen(SERVICE["url"], body, timeout=30) as answer:
        return json.loads(answer.read())["scores"]


def retrying_remote_letters(completions, letters, **kwargs):
    """docs/faults.md's recipe: retry what a service's bad moment gives (5xx, a refused or broken connection, a
    timeout), with growing waits; anything else, or the last failure, is raised."""
    for wait in [*RETRY_WAITS_S, None]:
        try:
            return remote_letters(completions, letters)
        except urllib.error.HTTPError as err:
            if err.code < 500 or wait is None:
                raise
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if wait is None:
                raise
        time.sleep(wait)


@pytest.fixture(scope="module")
def service():
    with reward_service(lambda request: letters_reward(**request)) as running:
        SERVICE["url"] = running.url
        yield running


class ServiceFaults(TrainerCallback):
    """As global step ``step`` begins (before its rollout is scored), have the service misbehave."""

    def __init__(self, faults: dict) -> None:
        self.faults = faults

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step in self.faults:
            self.faults.pop(state.global_step)()


def test_a_reward_function_that_retries_rides_out_a_failing_service(reference, tmp_path, service):
    """The port closed for 0.3 s as the first rollout is scored, two 500s as the second is: the run goes on and trains
    exactly what the uninterrupted run does."""
    service.answered.clear()
    faults = ServiceFaults({0: lambda: service.down_for(0.3), FAULT_AT: lambda: service.fail(2)})
    trainer = make_trainer(tmp_path, reward_funcs=[retrying_remote_letters], callbacks=[faults], **RUN)
    trainer.train()
    assert service.answered.count(500) == 2 and not faults.faults
    weights, curves = reference
    assert all(torch.equal(tensor, weights[name]) for name, tensor in weights_of(trainer).items())
    assert curves_of(trainer) == curves


def test_a_service_error_stops_the_run_naming_the_service_and_the_step(reference, tmp_path, service):
    """A function that does not retry: the run stops with the service's error, its URL, the step and what to do;
    once the service answers again, the same command resumes to the uninterrupted run's weights."""
    faults = ServiceFaults({FAULT_AT: lambda: service.fail(1)})
    with pytest.raises(RewardFunctionError) as failed:
        make_trainer(tmp_path, reward_funcs=[remote_letters], callbacks=[faults], **RUN).train()
    message = str(failed.value)
    assert message.startswith(
        f"reward function 'remote_letters' raised HTTPError: HTTP Error 500: Internal Server Error (calling "
        f"{service.url}) at global step {FAULT_AT}. The run stopped; its checkpoints are intact"
    )
    assert "run the same command with resume_from_checkpoint=True" in message and "docs/faults.md" in message
    assert_loadable_checkpoints(tmp_path, ["checkpoint-3"])
    assert_resumes_to_the_reference(tmp_path, reference, remote_letters)
