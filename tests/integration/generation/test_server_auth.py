"""The vLLM server's key and one-run claim (steadyrl/generation/server_auth.py), fast: against the stand-in server,
which is guarded by the same middleware as the server `steadyrl vllm-serve` starts
(tests/integration/generation/test_vllm_server.py checks the real one); the key files of `steadyrl vllm-serve`; a
failed weight push stops every process at once."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, free_port
from support.vllm_server_standin import model_config, start
from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl.cli.main import main as steadyrl_main
from steadyrl.cli.serve import build_parser, prepare_key
from steadyrl.generation import SamplingSettings, VLLMServerError
from steadyrl.generation.server_auth import KEY_ENV, KEY_FILE_ENV, ServerAuth, default_key_file
from steadyrl.generation.server_client import ServerClient
from steadyrl.generation.server_weights import WeightTransfer
from steadyrl.generation.vllm_server import ServerSettings, VLLMServerBackend
from steadyrl.toy import toy_model_path


@pytest.fixture
def standin():
    url, server = start(model_config())
    yield server
    server.shutdown()


def raw(url: str, method: str, path: str, key: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    """(status, JSON body) of one request, with ``key`` as its bearer token if given."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read()
    return status, json.loads(text) if text.strip() else {}


class RecordingTransfer(WeightTransfer):
    def __init__(self) -> None:
        super().__init__(client=None)
        self.versions: list[int] = []

    def push(self, weights, version: int) -> None:
        self.versions.append(version)


def backend(url: str, output_dir, transfer: WeightTransfer | None = None) -> VLLMServerBackend:
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    settings = ServerSettings(
        base_url=url,
        timeout=10,
        weight_transfer="file",
        weights_dir=str(output_dir / "w"),
        group_host="",
        group_port=0,
        model=toy_model_path(),
        max_model_len=256,
        dtype="float32",
        logprobs_mode="processed_logprobs",
        output_dir=str(output_dir),
    )
    return VLLMServerBackend(tokenizer, SamplingSettings(max_new_tokens=4), settings, transfer)


# ---- the key ---------------------------------------------------------------------------------------------------------


def test_every_route_but_health_needs_the_key_and_a_refused_request_changes_nothing(standin):
    routes = [
        ("GET", "/version"),
        ("GET", "/server_info?config_format=json"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/completions"),
        ("POST", "/steadyrl/claim"),
        ("GET", "/steadyrl/claim"),
        ("POST", "/steadyrl/release"),
        ("GET", "/no/such/route"),
        ("OPTIONS", "/collective_rpc"),
        ("POST", "/collective_rpc"),
        ("POST", "/update_weights"),
        ("POST", "/init_weight_transfer_engine"),
    ]
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/tmp/anyone"}}
    for method, path in routes:
        for key, problem in (
            (None, "missing key: send the header 'Authorization: Bearer <key>'"),
            ("not-the-key", "wrong key"),
            (f"{standin.key}x", "wrong key"),
        ):
            status, body = raw(standin.url, method, path, key, rpc if method == "POST" else None)
            assert status == 401 and body["error"].startswith(problem), (method, path, key, status, body)
    assert standin.rpc_calls == [], "a request without the key reached a route"
    status, claim = raw(standin.url, "GET", "/steadyrl/claim", standin.key)
    assert status == 200 and claim["holder"] is None and claim["weights"] is None
    assert raw(standin.url, "GET", "/health")[0] == 200, "the liveness probe needs no key"
    assert raw(standin.url, "POST", "/collective_rpc", standin.key, rpc)[0] == 200
    assert standin.rpc_calls == [("reload_weights", {"weights_path": "/tmp/anyone"})]


def test_the_trainer_sends_the_key_it_finds_in_the_environment_or_the_key_file(standin, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    assert ServerClient(standin.url, 10).request("GET", "/version") == {"version": "0.32.0"}  # port's key file
    copy = tmp_path / "key"
    copy.write_text(standin.key + "\n")
    monkeypatch.setenv(KEY_FILE_ENV, str(copy))
    standin.key_file.unlink()
    assert ServerClient(standin.url, 10).request("GET", "/version") == {"version": "0.32.0"}
    monkeypatch.setenv(KEY_ENV, standin.key)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "missing"))
    assert ServerClient(standin.url, 10).request("GET", "/version") == {"version": "0.32.0"}
    monkeypatch.delenv(KEY_ENV)
    no_key = rf"refused the trainer's key .*the trainer found no key \(\${KEY_FILE_ENV}="
    with pytest.raises(VLLMServerError, match=no_key):
        ServerClient(standin.url, 10).request("GET", "/version")


def test_the_middleware_reads_its_key_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    with pytest.raises(RuntimeError, match=f"needs a key: set {KEY_ENV} or {KEY_FILE_ENV}"):
        ServerAuth(app=None)
    (tmp_path / "key").write_text("from-the-file\n")
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "key"))
    assert ServerAuth(app=None).key == b"from-the-file"
    monkeypatch.setenv(KEY_ENV, "from-the-environment")
    assert ServerAuth(app=None).key == b"from-the-environment"


# ---- the claim -------------------------------------------------------------------------------------------------------


def test_one_run_holds_the_server_a_restarted_run_reclaims_it_and_it_is_free_once_released(standin, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    first = backend(standin.url, tmp_path / "a", RecordingTransfer())
    assert raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"] is None, "claimed as it pushes"
    first.sync_weights(model, version=0)
    holder = raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"]
    assert holder["output_dir"] == str((tmp_path / "a").resolve()) and holder["pid"] == os.getpid()
    with pytest.raises(VLLMServerError, match=rf"serves another run, output_dir='{tmp_path / 'a'}' \(process "):
        backend(standin.url, tmp_path / "b")
    client_b = ServerClient(standin.url, 10, output_dir=str(tmp_path / "b"))
    with pytest.raises(VLLMServerError, match="serves another run"):  # any request of that run, not only its claim
        client_b.collective_rpc("reload_weights", {"weights_path": str(tmp_path)})
    assert standin.rpc_calls == []
    restarted = backend(standin.url, tmp_path / "a", RecordingTransfer())  # the same output_dir: the same run
    restarted.sync_weights(model, version=1)
    assert restarted.transfer.versions == [1]

    restarted.close()  # the end of training: the server is free
    assert raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"] is None
    second = backend(standin.url, tmp_path / "b", RecordingTransfer())
    second.sync_weights(model, version=0)
    with pytest.raises(VLLMServerError, match=rf"serves another run, output_dir='{tmp_path / 'b'}'"):
        first.sync_weights(model, version=2)  # a closed run claims again before it pushes
    assert first.transfer.versions == [0]
    second.close()
    first.sync_weights(model, version=2)
    assert first.transfer.versions == [0, 2]
    assert raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"]["output_dir"].endswith("/a")
    first.close()


def test_a_claim_is_released_only_by_its_run(standin, tmp_path):
    a = ServerClient(standin.url, 10, output_dir=str(tmp_path / "a"))
    a.claim()
    ServerClient(standin.url, 10, output_dir=str(tmp_path / "b")).release()
    assert raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"]["output_dir"].endswith("/a")
    a.release()
    assert raw(standin.url, "GET", "/steadyrl/claim", standin.key)[1]["holder"] is None


# ---- steadyrl vllm-serve ---------------------------------------------------------------------------------------------


def test_vllm_serve_listens_on_loopback_guards_every_route_and_writes_a_private_key_it_never_prints(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("STEADYRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    port = free_port()
    assert steadyrl_main(["vllm-serve", "--model", "m", "--port", str(port), "--print"]) == 0
    printed = capsys.readouterr()
    key_file = default_key_file(port)
    assert str(key_file).startswith(str(tmp_path / "cache"))
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(key) >= 40 and key not in printed.out + printed.err
    for part in (
        "--host 127.0.0.1",
        "--middleware steadyrl.generation.server_auth.ServerAuth",
        f"{KEY_FILE_ENV}={key_file} ",
    ):
        assert part in printed.out, part

    assert steadyrl_main(["vllm-serve", "--model", "m", "--port", str(port), "--print"]) == 0
    assert key_file.read_text().strip() == key, "printing the command keeps the key a running server checks"
    prepare_key(build_parser().parse_args(["--model", "m", "--port", str(port)]))  # what a start does
    assert key_file.read_text().strip() != key, "a new server, a new key"
    assert steadyrl_main(["vllm-serve", "--model", "m", "--host", "10.1.2.3", "--port", str(port), "--print"]) == 0
    assert f"{KEY_FILE_ENV}={default_key_file(port, '10.1.2.3')} " in capsys.readouterr().out
    assert default_key_file(port, "10.1.2.3").name == f"10.1.2.3-port-{port}.key", "the key of a server elsewhere"
    named = tmp_path / "shared" / "key"
    assert steadyrl_main(["vllm-serve", "--model", "m", "--key-file", str(named), "--print"]) == 0
    made = named.read_text()
    assert stat.S_IMODE(named.stat().st_mode) == 0o600
    assert steadyrl_main(["vllm-serve", "--model", "m", "--key-file", str(named), "--print"]) == 0
    assert named.read_text() == made, "a named key file is made once, then kept"
    assert f"{KEY_FILE_ENV}={named} " in capsys.readouterr().out
    monkeypatch.setenv(KEY_ENV, "the-users-key")
    assert steadyrl_main(["vllm-serve", "--model", "m", "--print"]) == 0
    out = capsys.readouterr().out
    assert KEY_FILE_ENV not in out and "the-users-key" not in out


# ---- a failed push on the main process -------------------------------------------------------------------------------

WORKER = """
import datetime, os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from accelerate import PartialState
PartialState(cpu=True, timeout=datetime.timedelta(seconds=8))
from integration.generation.test_server_auth import backend, RecordingTransfer
from transformers import AutoModelForCausalLM
from steadyrl.generation import VLLMServerError
from steadyrl.toy import toy_model_path

class FailingTransfer(RecordingTransfer):
    def push(self, weights, version):
        raise VLLMServerError("the server could not load the weights")

rank, out = int(os.environ["RANK"]), Path({out!r})
remote = backend({url!r}, out / "run", FailingTransfer())
try:
    remote.sync_weights(AutoModelForCausalLM.from_pretrained(toy_model_path()), version=1)
    outcome = "pushed"
except Exception as err:
    outcome = f"{{type(err).__name__}}: {{err}}"
(out / f"rank{{rank}}.txt").write_text(outcome)
deadline = time.monotonic() + 30
while rank == 0 and not (out / "rank1.txt").exists() and time.monotonic() < deadline:
    time.sleep(0.2)  # alive, as a trainer process that raised would be while it winds down
"""


def test_a_push_failing_on_the_main_process_raises_on_every_process_at_once(standin, tmp_path):
    code = WORKER.format(tests=str(ROOT / "tests"), out=str(tmp_path), url=standin.url)
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    outcomes = [
        (tmp_path / f"rank{r}.txt").read_text() if (tmp_path / f"rank{r}.txt").exists() else None for r in (0, 1)
    ]
    expected = "VLLMServerError: the run lost its vLLM server: the server could not load the weights. It stopped here"
    for rank, outcome in enumerate(outcomes):
        assert outcome is not None and outcome.startswith(expected), (rank, outcome, outputs[rank][-2000:])
