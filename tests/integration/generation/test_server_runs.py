"""Which run a vLLM server serves (steadyrl/generation/server_auth.py, vllm_server.py), against the stand-in server: a
run is the random id its output_dir keeps, not the output_dir's path; a run pushes weights only with its output_dir
locked (evaluate() outside train() too), and frees the server after it; runs sharing vllm_server_weights_dir keep
their own versions."""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from support.toy_run import make_trainer
from support.vllm_server_standin import model_config, start
from transformers import AutoModelForCausalLM, TrainerCallback

from integration.generation.test_server_auth import RecordingTransfer, backend, raw
from steadyrl.checkpoint.ownership import OutputDirInUse, OutputDirLock
from steadyrl.generation import VLLMServerError
from steadyrl.generation.server_client import ServerClient
from steadyrl.generation.server_weights import FileTransfer
from steadyrl.generation.vllm_server import server_settings
from steadyrl.toy import toy_dataset, toy_model_path

SERVER = dict(use_vllm=True, vllm_dtype="float32", vllm_mode="server")


@pytest.fixture
def standin():
    url, server = start(model_config())
    yield server
    server.shutdown()


def holder(standin) -> dict | None:
    return raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"]


def test_a_run_on_another_host_whose_output_dir_has_the_same_path_is_another_run(standin, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    out = tmp_path / "out"  # e.g. /workspace/out on two hosts
    out.mkdir()
    backend(standin.url, out, RecordingTransfer()).sync_weights(model, version=0)
    assert holder(standin)["output_dir"] == str(out.resolve())
    shutil.copytree(out, tmp_path / "copy")  # its id file too: a copy elsewhere is still another run
    with pytest.raises(VLLMServerError, match=rf"serves another run, output_dir='{out}'"):
        backend(standin.url, tmp_path / "copy", RecordingTransfer())
    os.rename(out, tmp_path / "first-host")
    out.mkdir()  # the other host's directory of the same path
    with pytest.raises(VLLMServerError, match=rf"serves another run, output_dir='{out}'"):
        backend(standin.url, out, RecordingTransfer())
    os.rename(out, tmp_path / "second-host")
    os.rename(tmp_path / "first-host", out)  # the first run, resumed: it claims the server again
    resumed = backend(standin.url, out, RecordingTransfer())
    resumed.sync_weights(model, version=1)
    assert resumed.transfer.versions == [1]
    resumed.close()


def test_runs_sharing_vllm_server_weights_dir_keep_their_own_versions(standin, tmp_path):
    shared = tmp_path / "shared-weights"
    config = SimpleNamespace(_name_or_path=toy_model_path())
    pushed = {}
    for name in ("a", "b"):
        args = SimpleNamespace(
            output_dir=str(tmp_path / name),
            vllm_server_weights_dir=str(shared),
            vllm_server_base_url=standin.url,
            vllm_server_host="",
            vllm_server_port=0,
            vllm_server_timeout=10,
            vllm_server_weight_transfer="file",
            vllm_group_port=0,
        )
        settings = server_settings(args, config, 256, "float32", "processed_logprobs")
        client = ServerClient(standin.url, 10, output_dir=args.output_dir)
        transfer = FileTransfer(client, settings.weights_dir, settings.weights_per_run)  # as the backend makes it
        transfer.push({"w": torch.zeros(2)}, version=len(pushed) + 1)
        pushed[name] = standin.rpc_calls[-1][1]["weights_path"]
    assert pushed["a"] != pushed["b"] and all(path.startswith(str(shared)) for path in pushed.values())
    assert os.path.isfile(os.path.join(pushed["a"], "model.safetensors")), "run b deleted run a's version"


def test_evaluate_outside_train_needs_the_output_dir_lock_and_frees_the_server(standin, tmp_path):
    out = tmp_path / "out"
    trainer = make_trainer(out, **SERVER, vllm_server_base_url=standin.url, eval_dataset=toy_dataset(num_prompts=2))
    assert holder(standin) is None, "building a trainer claims nothing"
    assert not (out / ".steadyrl-run-id").exists(), "nor writes its run's id before a claim"
    live = OutputDirLock(out)  # the run training in this output_dir
    live.acquire()
    try:
        with pytest.raises(OutputDirInUse, match="is in use by another run"):
            trainer.evaluate()
    finally:
        live.release()
    assert standin.rpc_calls == [] and holder(standin) is None, "weights pushed into the live run's server"
    assert not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").stat().st_size == 0
    metrics = trainer.evaluate()
    assert "eval_completions/mean_length" in metrics
    assert [method for method, _ in standin.rpc_calls] == ["reload_weights"]
    assert holder(standin) is None, "evaluate() left the server claimed"


def test_evaluate_at_the_end_of_train_leaves_the_server_free(standin, tmp_path):
    class EvaluateAtEnd(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            self.metrics = self.trainer.evaluate()

    at_end = EvaluateAtEnd()
    trainer = make_trainer(
        tmp_path / "out",
        callbacks=[at_end],
        max_steps=1,
        **SERVER,
        vllm_server_base_url=standin.url,
        eval_dataset=toy_dataset(num_prompts=2),
    )
    at_end.trainer = trainer
    trainer.train()
    assert "eval_completions/mean_length" in at_end.metrics
    assert holder(standin) is None, "the evaluation after the loop left the server claimed"
