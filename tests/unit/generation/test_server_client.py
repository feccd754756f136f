"""The vLLM server's HTTP client (steadyrl/generation/server_client.py) against small in-process HTTP servers of the
standard library: no proxy for a server on this machine, no redirect followed with the key, the key file of the
server's host and port, and a clear error for an answer that is not JSON."""

from __future__ import annotations

import pytest
from support.plain_http import http_server

from steadyrl.generation import VLLMServerError
from steadyrl.generation.server_auth import KEY_ENV, KEY_FILE_ENV, KeySource, default_key_file, write_new_key
from steadyrl.generation.server_client import ServerClient

KEY = KeySource("the-servers-key", "$" + KEY_ENV)


def test_a_server_on_this_machine_is_reached_without_the_environments_proxy(monkeypatch):
    with http_server() as server, http_server(body=b'{"version": "from the proxy"}') as proxy:
        for name in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        assert ServerClient(server.url, 10, key=KEY).request("GET", "/version") == {"version": "0.32.0"}
        assert proxy.seen == [], "the proxy saw the key"


def test_a_redirect_is_refused_and_the_key_never_reaches_its_target():
    with http_server() as target:
        with http_server(307, b"", {"Location": target.url + "/version"}) as redirecting:
            with pytest.raises(VLLMServerError, match=r"with a redirect \(307\) to 'http://127.0.0.1:\d+/version'"):
                ServerClient(redirecting.url, 10, key=KEY).request("GET", "/version")
            assert redirecting.seen == [("/version", "Bearer the-servers-key")]
        assert target.seen == [], "the key went to the redirect's target"


def test_the_key_file_is_the_servers_host_and_port(tmp_path, monkeypatch):
    monkeypatch.setenv("STEADYRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    write_new_key(default_key_file(8000))  # a server on this machine, port 8000
    local = default_key_file(8000).read_text().strip()
    assert ServerClient("http://127.0.0.1:8000", 10).key.key == local
    assert ServerClient("http://localhost:8000", 10).key.key == local
    remote = ServerClient("http://gpu-box:8000", 10).key
    assert remote.key is None and "gpu-box-port-8000.key" in remote.where, "a remote server got the local key"
    write_new_key(default_key_file(8000, "gpu-box"))
    assert ServerClient("http://gpu-box:8000", 10).key.key == default_key_file(8000, "gpu-box").read_text().strip()


def test_an_answer_that_is_not_json_names_the_url_the_status_and_the_start_of_the_body():
    with http_server(body=b"<html><body>Welcome to nginx!</body></html>" + b"x" * 5000) as server:
        with pytest.raises(VLLMServerError) as caught:
            ServerClient(server.url, 10, key=KEY).request("GET", "/version", what="reading its version")
    message = str(caught.value)
    assert f"the answer of {server.url}/version (reading its version, status 200) is not JSON" in message
    assert "'<html><body>Welcome to nginx!" in message and "x" * 300 not in message
    assert caught.value.__cause__ is not None and caught.value.status == 200
