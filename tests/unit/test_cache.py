"""Artefacts built once into the cache (steadyrl/cache.py): under $STEADYRL_CACHE, built on the first call only, and
a build that fails or a copy left unfinished never taken for a finished one. A build killed by SIGKILL:
tests/integration/real_model/test_real_fixture.py."""

from __future__ import annotations

import json

import pytest

from steadyrl.cache import build_cached, cache_dir


def counting_build(calls: list):
    def build(directory):
        calls.append(directory)
        (directory / "config.json").write_text(json.dumps({"build": len(calls)}))

    return build


def test_an_artefact_is_built_once_into_the_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("STEADYRL_CACHE", str(tmp_path / "cache"))
    calls = []
    first = build_cached("model", counting_build(calls))
    assert first == str(cache_dir() / "model") == str(tmp_path / "cache" / "model")
    assert build_cached("model", counting_build(calls)) == first and len(calls) == 1
    assert calls[0].name != "model", "built aside, then renamed into place"


def test_a_failed_or_unfinished_build_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("STEADYRL_CACHE", str(tmp_path))

    def fails(directory):
        (directory / "config.json").write_text("{}")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_cached("model", fails)
    assert not (tmp_path / "model").exists() and not list(tmp_path.glob(".model-build-*")), "nothing left behind"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"half")  # a copy without config.json is unfinished
    calls = []
    build_cached("model", counting_build(calls))
    assert len(calls) == 1 and sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json"]
