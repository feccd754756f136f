"""A vLLM server that restarts or goes away during a run (steadyrl/generation/server_recovery.py, vllm_server.py,
server_auth.py), fast: against the stand-in server (tests/support/vllm_server_standin.py), which restarts on its port
as a new server process would, with its startup weights, no claim and maybe a new key.
tests/integration/generation/test_vllm_server.py checks the same against a real server."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from support.vllm_server_standin import model_config, start
from transformers import AutoModelForCausalLM

from integration.generation.test_server_auth import backend, raw
from steadyrl.generation import VLLMServerError
from steadyrl.ops.finite import NonFiniteError
from steadyrl.toy import toy_model_path

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12], [13], [14, 15], [16, 17, 18], [19], [20, 21]]
SEEDS = list(range(100, 108))


@pytest.fixture
def standin():
    url, server = start(model_config())
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(toy_model_path())


def reloads(standin) -> list[str]:
    return [kwargs["weights_path"] for method, kwargs in standin.rpc_calls if method == "reload_weights"]


def test_a_server_restarted_between_two_generations_of_one_version_gets_the_weights_before_it_answers(
    standin, model, tmp_path
):
    remote = backend(standin.url, tmp_path)
    remote.sync_weights(model, version=1)
    first = remote.generate(model, PROMPTS, SEEDS).completion_ids
    pushed = standin.loaded
    assert pushed.endswith("/v1") and sorted(standin.answered) == [(seed, pushed) for seed in SEEDS]
    standin.restart()  # its startup weights, no claim
    standin.answered.clear()
    remote.sync_weights(model, version=1)  # the trainer's weights have not changed: nothing new to push
    again = remote.generate(model, PROMPTS, SEEDS).completion_ids
    assert [weights for _, weights in standin.answered] == [pushed] * len(SEEDS), "answered with startup weights"
    assert again == first and reloads(standin) == [pushed, pushed], "pushed again, from the copy on disk"
    holder = raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"]
    assert holder["output_dir"] == str(tmp_path.resolve()), "the restarted server is claimed for the run again"
    remote.close()


def test_a_server_killed_mid_generation_and_started_again_answers_the_interrupted_requests_with_their_seeds(
    standin, model, tmp_path, caplog
):
    remote = backend(standin.url, tmp_path)
    remote.server.concurrency = 1  # one request at a time: the server goes down before the third
    remote.sync_weights(model, version=3)
    pushed = standin.loaded
    complete, calls = remote.client.complete, []

    def kill_before_the_third(body):
        calls.append(body["seed"])
        if len(calls) == 3:
            standin.stop()  # connections refused from here on
            threading.Timer(1.5, standin.restart, kwargs=dict(new_key=True)).start()  # a new key in the port's file
        return complete(body)

    remote.client.complete = kill_before_the_third
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="steadyrl.generation.vllm_server"):
        generation = remote.generate(model, PROMPTS, SEEDS)
    assert time.monotonic() - start < 8
    assert len(generation.completion_ids) == len(PROMPTS)
    assert standin.answered == [(seed, pushed) for seed in SEEDS], "each request answered once, with its seed"
    assert calls == [*SEEDS[:2], *SEEDS[2:], *SEEDS[2:]]  # each interrupted request sent once more, in order
    assert "lost the run's weights during generation" in caplog.text and "the 6 interrupted completion" in caplog.text
    remote.close()


def test_a_server_that_does_not_come_back_in_time_stops_the_run_clearly(standin, model, tmp_path):
    remote = backend(standin.url, tmp_path)
    remote.server.timeout = 1.0
    remote.sync_weights(model, version=1)
    standin.stop()
    start = time.monotonic()
    with pytest.raises(VLLMServerError) as failure:
        remote.generate(model, PROMPTS, SEEDS)
    assert time.monotonic() - start < 5, "waited longer than vllm_server_timeout"
    message = str(failure.value)
    assert message.startswith(f"the run lost its vLLM server: no vLLM server answers at {standin.url}"), message
    assert "waited vllm_server_timeout=1 s for it to answer again. It stopped here" in message


def test_a_server_that_comes_back_serving_another_model_stops_the_run(standin, model, tmp_path):
    remote = backend(standin.url, tmp_path)
    remote.sync_weights(model, version=1)
    standin.restart(model_config(model="/models/other", served_model_name="/models/other"))
    with pytest.raises(VLLMServerError, match=r"lost its vLLM server: .* serves '/models/other', not the trainer's"):
        remote.generate(model, PROMPTS, SEEDS)
    assert standin.answered == [], "the other model answered"


def test_processes_of_one_run_that_find_the_server_restarted_push_the_weights_once(standin, model, tmp_path):
    first = backend(standin.url, tmp_path)
    first.sync_weights(model, version=2)
    second = backend(standin.url, tmp_path)  # another process of the run: the main process pushed for it
    second.pushed(first.on_server.label, 2, 2)
    standin.restart()
    results = {}
    threads = [
        threading.Thread(target=lambda b=b, n=n: results.__setitem__(n, b.generate(model, PROMPTS, SEEDS)))
        for n, b in (("first", first), ("second", second))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results) == ["first", "second"]
    assert len(reloads(standin)) == 2, "the restarted server was pushed to more than once"
    assert {weights for _, weights in standin.answered} == {reloads(standin)[0]}
    first.close()


# ---- the server's side -----------------------------------------------------------------------------------------------


def test_a_completion_that_names_weights_the_server_does_not_hold_is_refused_before_the_model(standin, tmp_path):
    run = backend(standin.url, tmp_path).client
    completion = {"model": toy_model_path(), "prompt": [5], "seed": 1}
    run.weights = "a-label-never-pushed"
    with pytest.raises(VLLMServerError, match=r"refused a completion request without this run's weights: .*started "):
        run.complete(completion)
    assert standin.answered == []
    answer = run.claim(push="mine", pusher="process-0")
    assert answer["push"] is True and answer["weights"] is None
    assert run.claim(push="mine", pusher="process-1")["push"] is False, "another process of the run pushes it"
    run.pushed("mine")
    assert raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["weights"] == "mine"
    assert run.claim(push="mine", pusher="process-1")["push"] is False, "already there"
    run.weights = "mine"
    assert run.complete(completion)["token_ids"] == [5] and standin.answered == [(1, None)]
    status, _ = raw(standin.url, "POST", "/steadyrl/weights", standin.key, {"run": "another", "weights": "x"})
    assert status == 409, "only the holder's run records its weights"
    run.release()
    assert raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["weights"] is None


def test_weights_that_are_not_finite_never_reach_the_server(standin, tmp_path):
    poisoned = AutoModelForCausalLM.from_pretrained(toy_model_path())
    with torch.no_grad():
        poisoned.model.norm.weight[3] = float("nan")
    with pytest.raises(
        NonFiniteError, match=r"weights of step 4 to the vLLM server: model.norm.weight \(1 of 256\) hold NaN"
    ):
        backend(standin.url, tmp_path).sync_weights(poisoned, version=4)
    assert standin.rpc_calls == [] and not (tmp_path / "w").exists()
