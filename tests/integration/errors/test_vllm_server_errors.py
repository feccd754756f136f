"""The rows of docs/errors.md's table ("When input is wrong") in the area vLLM server: its settings, then a server that
is down or does not fit (support/vllm_server_standin.py). Each row's trigger provokes its error, checked against the
table's text (errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

import pytest
from support.toy_run import make_trainer

from integration.errors.error_table import Context, Triggers

trigger = Triggers(__file__)
config_error = trigger.config_error


# vLLM server mode: config checks, then a server that is down or does not fit (support/vllm_server_standin.py)

SERVER = dict(use_vllm=True, vllm_dtype="float32", vllm_mode="server")
config_error("vllm-mode", use_vllm=True, vllm_mode="remote")
config_error("vllm-server-use-vllm", vllm_mode="server")
config_error("vllm-server-port", **SERVER, vllm_server_port=0)
config_error("vllm-server-timeout", **SERVER, vllm_server_timeout=0)
config_error("vllm-server-url", **SERVER, vllm_server_base_url="localhost:8000")
config_error("vllm-server-twice", **SERVER, vllm_server_base_url="http://a:8000,http://a:8000")
config_error(
    "vllm-servers-adapter", **SERVER, vllm_server_base_url="http://a:8000,http://b:8000", vllm_lora_sync="adapter"
)
config_error("vllm-server-transfer", **SERVER, vllm_server_weight_transfer="shm")
config_error("vllm-server-nccl-cpu", **SERVER, vllm_server_weight_transfer="nccl")


@trigger("vllm-server-down")
def _(ctx):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    make_trainer(ctx.tmp_path, **SERVER, vllm_server_host="127.0.0.1", vllm_server_port=port)


def standin_error(row_id: str, dev_mode: bool = True, version: str = "0.32.0", **changes) -> None:
    """A row whose error a server of vLLM ``version`` reporting the toy model's settings with ``changes`` provokes at
    start-up (``dev_mode=False``: a server without its development routes)."""

    def provoke(ctx):
        from support.vllm_server_standin import model_config, start

        url, server = start(model_config(**changes) if dev_mode else None, version)
        try:
            make_trainer(ctx.tmp_path, **SERVER, vllm_server_base_url=url)
        finally:
            server.shutdown()

    trigger(row_id)(provoke)


@trigger("vllm-server-lora")
def _(ctx):
    from peft import LoraConfig
    from support.vllm_server_standin import model_config, start

    url, server = start(model_config())  # no lora_config: started without --max-lora-rank
    try:
        make_trainer(
            ctx.tmp_path,
            **SERVER,
            vllm_server_base_url=url,
            vllm_lora_sync="adapter",
            peft_config=LoraConfig(r=4, target_modules=["q_proj"]),
        )
    finally:
        server.shutdown()


standin_error("vllm-server-dev-mode", dev_mode=False)
standin_error("vllm-server-version", version="0.40.0")
standin_error("vllm-server-model", model="/models/other", served_model_name="/models/other")
standin_error("vllm-server-context", max_model_len=128)
standin_error("vllm-server-dtype", dtype="torch.bfloat16")
standin_error("vllm-server-logprobs", logprobs_mode="raw_logprobs")


def standin_run(ctx, first_run: bool = False, **start_kwargs) -> None:
    """A trainer built against a stand-in (``start_kwargs``: ``start``'s), after another run's if ``first_run``."""
    from support.vllm_server_standin import model_config, start

    url, server = start(model_config(), **start_kwargs)
    try:
        if first_run:  # a run that has pushed its weights: it holds the server
            from steadyrl.generation.server_client import ServerClient

            ServerClient(url, 10, output_dir=str(ctx.tmp_path / "first")).claim()
        make_trainer(ctx.tmp_path / "second", **SERVER, vllm_server_base_url=url)
    finally:
        server.shutdown()


@trigger("vllm-server-key")
def _(ctx):
    ctx.monkeypatch.setenv("STEADYRL_VLLM_SERVER_KEY", "not-the-servers-key")
    standin_run(ctx)


trigger("vllm-server-claimed")(lambda ctx: standin_run(ctx, first_run=True))
trigger("vllm-server-unguarded")(lambda ctx: standin_run(ctx, auth=False))


@trigger("vllm-server-redirect")
def _(ctx):
    from support.plain_http import http_server

    with http_server(307, b"", {"Location": "https://127.0.0.1:8443/health"}) as server:
        make_trainer(ctx.tmp_path, **SERVER, vllm_server_base_url=server.url)


@trigger("vllm-server-not-json")
def _(ctx):
    from support.plain_http import http_server

    with http_server(body=b"<html><body>Welcome to nginx!</body></html>") as server:
        make_trainer(ctx.tmp_path, **SERVER, vllm_server_base_url=server.url)


@trigger("vllm-serve-port-busy")
def _(ctx):
    import socket

    ctx.monkeypatch.delenv("STEADYRL_VLLM_SERVER_KEY", raising=False)
    ctx.monkeypatch.delenv("STEADYRL_VLLM_SERVER_KEY_FILE", raising=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        return ctx.cli("vllm-serve", "--model", "m", "--port", busy.getsockname()[1], "--print")


@trigger("vllm-server-stopped")
def _(ctx):
    from support.vllm_server_standin import model_config, start

    url, server = start(model_config())
    trainer = make_trainer(ctx.tmp_path, **SERVER, vllm_server_base_url=url, vllm_server_timeout=1)
    server.shutdown()
    server.server_close()
    trainer.train()


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
