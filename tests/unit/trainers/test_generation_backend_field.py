"""``generation_backend`` is a config field: it picks the registered backend by name, and TRL's ``use_vllm`` /
``vllm_mode`` are its synonyms, kept consistent with it both ways (when the config is built and when a script sets
them later); a contradiction or an unregistered name is refused. A checkpoint written before the field existed
resumes as before."""

from __future__ import annotations

import pytest
import torch

from steadyrl import GRPOConfig, RLOOConfig
from steadyrl.checkpoint.fingerprint import CheckpointError, check_resumable
from steadyrl.cli.train import parse
from steadyrl.generation import BACKENDS, Capabilities, Generation, GenerationBackend, make_backend
from steadyrl.trainers.config.resume_settings import split_settings


class CopyingBackend(GenerationBackend):
    """A user's backend: samples from copies of the weights and reports log-probs, as the vLLM server does."""

    capabilities = Capabilities(returns_logprobs=True, weight_push=frozenset({"full"}), pushes_copies=True)

    def generate(self, model, prompt_ids, seeds):
        return Generation([[0] for _ in prompt_ids], [[0.0] for _ in prompt_ids])


@pytest.fixture
def copying(monkeypatch):
    monkeypatch.setitem(BACKENDS, "copying", CopyingBackend)
    return "copying"


def build(tmp_path, config_class=RLOOConfig, **settings):
    return config_class(output_dir=str(tmp_path), report_to="none", use_cpu=True, **settings)


def choice(config) -> tuple:
    return config.generation_backend, config.use_vllm, config.vllm_mode


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({}, ("hf", False, "colocate")),
        ({"use_vllm": True}, ("vllm_colocate", True, "colocate")),
        ({"use_vllm": True, "vllm_mode": "server"}, ("vllm_server", True, "server")),
        ({"use_vllm": False, "vllm_mode": "colocate"}, ("hf", False, "colocate")),  # TRL's defaults, as converted
        ({"generation_backend": "hf"}, ("hf", False, "colocate")),
        ({"generation_backend": "vllm_colocate"}, ("vllm_colocate", True, "colocate")),
        ({"generation_backend": "vllm_server"}, ("vllm_server", True, "server")),
        (
            {"generation_backend": "vllm_server", "use_vllm": True, "vllm_mode": "server"},
            ("vllm_server", True, "server"),
        ),
        ({"generation_backend": "hf", "use_vllm": False, "vllm_mode": "colocate"}, ("hf", False, "colocate")),
        ({"generation_backend": "vllm_server", "use_vllm": False}, ("vllm_server", True, "server")),  # the default
    ],
    ids=lambda v: ",".join(f"{k}={v}" for k, v in v.items()) if isinstance(v, dict) else None,
)
def test_the_backend_resolves_from_either_name(tmp_path, settings, expected):
    assert choice(build(tmp_path, **settings)) == expected


def test_a_registered_backend_is_picked_by_generation_backend_alone(tmp_path, copying):
    ahead = dict(max_staleness=1, vllm_importance_sampling_correction=True)  # read off the backend's capabilities
    config = build(tmp_path, GRPOConfig, generation_backend=copying, **ahead)
    assert choice(config) == ("copying", False, "colocate"), "not vLLM: TRL's use_vllm reads False"
    backend = make_backend(config, None, None, torch.device("cpu"), logprob_temperature=1.0)
    assert isinstance(backend, CopyingBackend)
    assert choice(build(tmp_path, generation_backend=copying, use_vllm=False)) == ("copying", False, "colocate")


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"generation_backend": "hf", "use_vllm": True},
            "generation_backend='hf' contradicts use_vllm=True: use_vllm=True generates with vLLM "
            "(generation_backend='vllm_colocate' or 'vllm_server'); give one of them.",
        ),
        (
            {"generation_backend": "vllm_server", "vllm_mode": "colocate"},
            "generation_backend='vllm_server' contradicts vllm_mode='colocate': vllm_mode='colocate' with "
            "use_vllm=True is generation_backend='vllm_colocate'; give one of them.",
        ),
        (
            {"generation_backend": "hf", "vllm_mode": "server"},
            "generation_backend='hf' contradicts vllm_mode='server': vllm_mode='server' with use_vllm=True is "
            "generation_backend='vllm_server'; give one of them.",
        ),
        (
            {"generation_backend": "tpu"},
            "generation_backend='tpu' is invalid: no generation backend is registered as 'tpu': "
            "steadyrl.generation.BACKENDS holds copying, hf, vllm_colocate, vllm_server. Register yours there "
            "(BACKENDS['tpu'] = YourBackend) before building the config, or use one of those.",
        ),
        (
            {"generation_backend": "copying", "use_vllm": True},
            "generation_backend='copying' contradicts use_vllm=True: use_vllm=True generates with vLLM "
            "(generation_backend='vllm_colocate' or 'vllm_server'); give one of them.",
        ),
    ],
    ids=["hf-use_vllm", "server-colocate", "hf-server", "unregistered", "own-use_vllm"],
)
def test_a_contradiction_or_an_unregistered_name_is_refused(tmp_path, copying, settings, message):
    with pytest.raises(ValueError) as refused:
        build(tmp_path, **settings)
    assert str(refused.value) == message


def test_the_names_stay_consistent_when_a_script_sets_them_later(tmp_path, copying):
    config = build(tmp_path)
    config.use_vllm = True
    assert choice(config) == ("vllm_colocate", True, "colocate")
    config.vllm_mode = "server"
    assert choice(config) == ("vllm_server", True, "server")
    config.use_vllm = False
    assert choice(config) == ("hf", False, "server"), "vllm_mode waits for use_vllm, as in TRL"
    config.generation_backend = "vllm_colocate"
    assert choice(config) == ("vllm_colocate", True, "colocate")
    config.generation_backend = copying
    assert choice(config) == ("copying", False, "colocate")
    config.use_vllm = False
    assert config.generation_backend == "copying", "use_vllm=False keeps a backend that is not vLLM"
    with pytest.raises(ValueError, match=r"^generation_backend='tpu' is invalid: no generation backend is regis"):
        config.generation_backend = "tpu"
    config.use_vllm = True
    with pytest.raises(ValueError, match=r"^vllm_mode='remote' is invalid: use 'colocate'"):
        config.vllm_mode = "remote"
    assert choice(config) == ("vllm_colocate", True, "colocate"), "a refused value changes nothing"


def test_the_command_line_takes_generation_backend(tmp_path):
    _, config = parse(GRPOConfig, ["--toy", "--output_dir", str(tmp_path), "--generation_backend", "vllm_server"])
    assert choice(config) == ("vllm_server", True, "server")
    _, config = parse(GRPOConfig, ["--toy", "--output_dir", str(tmp_path), "--use_vllm", "--vllm_mode", "server"])
    assert choice(config) == ("vllm_server", True, "server")


def test_the_fingerprint_records_the_backend_and_a_checkpoint_from_before_the_field_resumes(tmp_path, copying):
    fixed, free = split_settings(build(tmp_path, use_vllm=True))
    assert (fixed["args.generation_backend"], fixed["args.use_vllm"], fixed["args.vllm_mode"]) == (
        "vllm_colocate",
        True,
        "colocate",
    )
    before_the_field = {key: value for key, value in fixed.items() if key != "args.generation_backend"}
    check_resumable(before_the_field, fixed, free, free, tmp_path)  # as before: use_vllm, vllm_mode compared
    hf_fixed, hf_free = split_settings(build(tmp_path))
    with pytest.raises(CheckpointError, match=r"\(use_vllm: checkpoint True, now False\)"):
        check_resumable(before_the_field, hf_fixed, free, hf_free, tmp_path)
    own_fixed, own_free = split_settings(build(tmp_path, generation_backend=copying))
    with pytest.raises(CheckpointError, match=r"generation_backend: checkpoint 'hf', now 'copying'"):
        check_resumable(hf_fixed, own_fixed, hf_free, own_free, tmp_path)


def test_a_config_subclass_naming_its_backend_still_picks_it(tmp_path, copying):
    """Before generation_backend was a field, a config subclass named a backend of its own in a class attribute."""

    class CopyingConfig(GRPOConfig):
        generation_backend = copying

    config = CopyingConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert choice(config) == (copying, False, "colocate")
