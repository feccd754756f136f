"""The Hub stand-in (support/hub_server.py) as a fixture: huggingface_hub sends every request to it."""

import pytest
from support.hub_server import start


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub.constants
    import transformers.utils.hub

    hub, server = start()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    # transformers keeps one HfApi, made with the endpoint of its first use: an earlier test's may be the real Hub's
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    server.shutdown()
    assert not hub.unexpected, f"requests the stand-in does not implement: {hub.unexpected}"
