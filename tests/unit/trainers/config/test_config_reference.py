"""The configuration is grouped and documented once: docs/configuration.md is what the dataclasses give."""

import dataclasses
import difflib
import signal
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from steadyrl.trainers import ALGORITHMS, OnPolicyConfig
from steadyrl.trainers.config.trl_names import UNSUPPORTED, TRLDefaultOnlyFields
from steadyrl.trainers.config_reference import COMMAND, configuration_page, field_owner, steadyrl_fields
from steadyrl.trainers.loop.preemption import stopped_status

PAGE = Path(__file__).resolve().parents[4] / "docs" / "configuration.md"
CONFIGS = [OnPolicyConfig, *(algorithm.config_class for algorithm in ALGORITHMS.values())]


def test_the_committed_page_is_what_the_dataclasses_give():
    committed, generated = PAGE.read_text(), configuration_page()
    lines = committed.splitlines(True), generated.splitlines(True)
    diff = "".join(difflib.unified_diff(*lines, "committed", "now", n=1))
    assert committed == generated, f"docs/configuration.md is out of date: run `{COMMAND}`\n{diff[:3000]}"


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_steadyrl_field_has_a_group_and_one_help(config_class):
    for group, group_fields in steadyrl_fields(config_class).items():
        assert "settings_group" in vars(group), f"{group.__name__} declares fields but names no settings_group"
        for config_field in group_fields:
            assert config_field.metadata.get("help"), f"{config_class.__name__}.{config_field.name} has no help"


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda cls: cls.__name__)
def test_help_texts_survive_argparse(config_class):
    """argparse expands ``%`` in help texts: a stray one breaks ``steadyrl <algorithm> --help``."""
    assert "--vllm_server_port" in HfArgumentParser(config_class).format_help()


def test_every_shared_field_but_the_trl_ones_is_in_a_group_of_its_own():
    """OnPolicyConfig itself declares no field: each sits in the mixin of its group."""
    assert steadyrl_fields(OnPolicyConfig)
    assert OnPolicyConfig not in steadyrl_fields(OnPolicyConfig)


def test_only_refused_trl_fields_sit_under_accepted_only_at_trls_default():
    refused_here = {f.name for f in dataclasses.fields(TRLDefaultOnlyFields)}
    assert refused_here == set(UNSUPPORTED)
    for name in (
        "vllm_mode",
        "vllm_server_base_url",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_server_timeout",
        "vllm_group_port",
        "vllm_server_weight_transfer",
        "vllm_server_weights_dir",
    ):
        assert field_owner(OnPolicyConfig, name).settings_group == "vLLM (colocated and server)"


def test_stop_on_signals_help_names_the_status_a_stopped_run_exits_with():
    help_text = OnPolicyConfig.__dataclass_fields__["stop_on_signal"].metadata["help"]
    for signum in (signal.SIGTERM, signal.SIGINT):
        assert f"{stopped_status(signum)} for {signum.name}" in help_text
    assert "status 0" not in help_text.split("last step")[0], "only a run that completes exits with status 0"
