"""The version fence around private internals (steadyrl/compat.py): an untested version fails loudly, or warns with
the escape hatch; the tested ranges are setup.cfg's. Fake modules stand in for the packages: no import, no trainer."""

import configparser
import logging
import sys
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from steadyrl import compat
from steadyrl.compat import ALLOW_UNTESTED, TESTED, UntestedVersionError, require_tested

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch):
    monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    require_tested.cache_clear()
    yield
    require_tested.cache_clear()


def installed(monkeypatch, package: str, version: str) -> None:
    module = types.ModuleType(package)
    module.__version__ = version
    monkeypatch.setitem(sys.modules, package, module)


@pytest.mark.parametrize(
    ("package", "version"),
    [("deepspeed", "0.20.0"), ("transformers", "5.20.1"), ("vllm", "0.33.0rc1"), ("vllm", "dev")],
)
def test_an_untested_version_fails_with_the_package_version_range_and_escape_hatch(monkeypatch, package, version):
    installed(monkeypatch, package, version)
    with pytest.raises(UntestedVersionError) as error:
        require_tested(package)
    message = str(error.value)
    assert f"private internals of {package}" in message
    assert f"{package} {version} is installed" in message
    assert f"{package}{TESTED[package]}" in message
    assert f"{ALLOW_UNTESTED}=1" in message
    with pytest.raises(UntestedVersionError):  # every use fails, not only the first
        require_tested(package)


@pytest.mark.parametrize(
    ("package", "version"), [("deepspeed", "0.19.8"), ("vllm", "0.32.0+cpu"), ("vllm", "0.32.1rc1")]
)
def test_a_tested_version_passes(monkeypatch, package, version):
    installed(monkeypatch, package, version)
    require_tested(package)


def test_the_escape_hatch_warns_once_instead(monkeypatch, caplog):
    installed(monkeypatch, "deepspeed", "0.21.0")
    monkeypatch.setenv(ALLOW_UNTESTED, "1")
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        require_tested("deepspeed")
        require_tested("deepspeed")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "deepspeed 0.21.0 is installed" in warnings[0] and "deepspeed>=0.15,<0.20" in warnings[0]
    assert ALLOW_UNTESTED in warnings[0]


def test_without_zero_the_deepspeed_version_is_never_checked(monkeypatch):
    installed(monkeypatch, "deepspeed", "0.99.0")
    torch_optimizer = types.SimpleNamespace(optimizer=types.SimpleNamespace(param_groups=[]))
    assert compat.zero_optimizer(torch_optimizer) is None
    with compat.zero3_hooks_lifted(types.SimpleNamespace()) as module:
        assert module is None


def test_without_zero3_the_transformers_version_is_never_checked(monkeypatch):
    from transformers.integrations import deepspeed as hf_deepspeed

    assert not hf_deepspeed.is_deepspeed_zero3_enabled()
    monkeypatch.setattr(compat, "installed_version", lambda package: pytest.fail(f"{package} was checked"))
    with compat.zero3_init_suspended():
        pass


def test_the_tested_ranges_are_the_ones_setup_cfg_states():
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    lines = config["options"]["install_requires"].split("\n")
    for extra in config["options.extras_require"].values():
        lines += extra.split("\n")
    stated = {r.name: str(r.specifier) for r in map(Requirement, filter(None, lines))}
    for package, tested in TESTED.items():
        assert stated[package] == str(Requirement(f"{package}{tested}").specifier), package
