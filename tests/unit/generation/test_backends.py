"""The backend registry: each config resolves to one registered backend by name, and the config's checks and the
trainer read that backend's declared capabilities, never use_vllm."""

from __future__ import annotations

import pytest
import torch

from steadyrl import GRPOConfig, RLOOConfig
from steadyrl.generation import (
    BACKENDS,
    Capabilities,
    Generation,
    GenerationBackend,
    HFGenerationBackend,
    SamplingSettings,
    VLLMGenerationBackend,
    VLLMServerBackend,
    backend_class,
    make_backend,
)


class CopyingBackend(GenerationBackend):
    """A throwaway engine that samples from copies of the weights and reports log-probs, as the vLLM server does."""

    capabilities = Capabilities(returns_logprobs=True, weight_push=frozenset({"full"}), pushes_copies=True)

    def generate(self, model, prompt_ids, seeds):
        return Generation([[0] for _ in prompt_ids], [[0.0] for _ in prompt_ids])

    def push_copy(self, weights, version):
        self.version = version


class CopyingConfig(GRPOConfig):
    generation_backend = "copying"


@pytest.mark.parametrize(
    "settings, name, cls",
    [
        ({}, "hf", HFGenerationBackend),
        ({"use_vllm": True}, "vllm_colocate", VLLMGenerationBackend),
        ({"use_vllm": True, "vllm_mode": "server"}, "vllm_server", VLLMServerBackend),
    ],
)
def test_each_config_resolves_to_one_registered_backend(tmp_path, settings, name, cls):
    config = RLOOConfig(output_dir=str(tmp_path), report_to="none", **settings)
    assert config.generation_backend == name and backend_class(name) is cls and BACKENDS[name] is cls


def test_each_backend_declares_what_the_trainer_asks_of_it():
    both = frozenset({"full", "adapter"})
    assert HFGenerationBackend.capabilities == Capabilities(runs_training_model=True, takes_images=True)
    vllm = dict(returns_logprobs=True, weight_push=both, takes_images=True)
    assert VLLMGenerationBackend.capabilities == Capabilities(**vllm)
    assert VLLMServerBackend.capabilities == Capabilities(**vllm, pushes_copies=True)
    with pytest.raises(AttributeError):  # frozen: a backend's capabilities are declared, not switched at run time
        HFGenerationBackend.capabilities.pushes_copies = True


def test_push_copy_on_hf_generate_is_refused_clearly():
    backend = HFGenerationBackend(None, SamplingSettings(max_new_tokens=4))
    with pytest.raises(NotImplementedError, match=r"HFGenerationBackend cannot generate from a copy .* max_staleness"):
        backend.push_copy({"w": torch.zeros(1)}, version=1)
    assert backend.max_model_len is None, "HF generate: the model's own context length"


def test_an_unregistered_name_is_refused_with_the_registered_ones():
    with pytest.raises(ValueError, match=r"no generation backend is registered as 'tpu'.*hf, vllm_colocate"):
        backend_class("tpu")


def test_max_staleness_reads_the_chosen_backends_capability(tmp_path, monkeypatch):
    ahead = dict(output_dir=str(tmp_path), report_to="none", max_staleness=1, vllm_importance_sampling_correction=True)
    with pytest.raises(ValueError, match=r"max_staleness=1 generates on a vLLM server.*vllm_mode='colocate'"):
        GRPOConfig(use_vllm=True, **ahead)  # colocated: no copies
    monkeypatch.setitem(BACKENDS, "copying", CopyingBackend)
    config = CopyingConfig(**ahead)  # neither use_vllm nor vllm_mode: the backend's capabilities decide
    backend = make_backend(config, None, None, torch.device("cpu"), logprob_temperature=1.0)
    assert isinstance(backend, CopyingBackend) and backend.settings.max_new_tokens == config.max_completion_length
    backend.push_copy({}, version=3)
    assert backend.version == 3


def test_the_importance_sampling_correction_needs_a_backend_that_reports_logprobs(tmp_path, monkeypatch):
    correction = dict(output_dir=str(tmp_path), report_to="none", vllm_importance_sampling_correction=True)
    with pytest.raises(ValueError, match="vllm_importance_sampling_correction=True needs use_vllm=True"):
        GRPOConfig(**correction)
    monkeypatch.setitem(BACKENDS, "copying", CopyingBackend)
    assert CopyingConfig(**correction).vllm_importance_sampling_correction


def test_generation_kwargs_override_the_sampling_settings_and_hf_generate_samples_with_them():
    """TRL's scripts pass ``generation_kwargs={"do_sample": True, ...}``: it overrides the settings (no "multiple
    values for keyword argument" from GenerationConfig) and generate runs with it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steadyrl.toy import toy_model_path

    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    extra = {"do_sample": True, "temperature": 0.7, "top_k": 5}
    backend = HFGenerationBackend(tokenizer, SamplingSettings(max_new_tokens=4, extra=extra))
    config = backend.generation_config()
    assert (config.do_sample, config.temperature, config.top_k, config.max_new_tokens) == (True, 0.7, 5, 4)
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    generation = backend.generate(model, [tokenizer("abc")["input_ids"]] * 2, seeds=[0, 1])
    assert len(generation.completion_ids) == 2 and all(len(ids) <= 4 for ids in generation.completion_ids)
