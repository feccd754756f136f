"""TRL's names of steadyrl's settings (``epsilon`` for ``cliprange``, ...) hold no value of their own: each setting is
stored once, under steadyrl's name, and TRL's name reads and writes it, as a constructor argument, a command-line flag,
a YAML key and an attribute, so that the two names cannot drift apart."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest
from transformers import HfArgumentParser

from steadyrl import GRPOConfig, OnlineDPOConfig, PPOConfig, RLOOConfig
from steadyrl.cli.train import parse
from steadyrl.ops import POLICY_LOSSES
from steadyrl.trainers.config.resume_settings import split_settings
from steadyrl.trainers.config.trl_names import MAX_NEW_TOKENS, SYNONYMS, Synonym

CONFIGS = [GRPOConfig, RLOOConfig, PPOConfig, OnlineDPOConfig]
VALUES = {  # a valid value, other than the default, for each setting
    "n_samples_per_prompt": 2,
    "num_ppo_epochs": 2,
    "cliprange": 0.3,
    "cliprange_high": 0.28,
    "vllm_max_model_len": 1024,
    "max_completion_length": 16,
}
CASES = [(GRPOConfig, synonym) for synonym in SYNONYMS] + [(OnlineDPOConfig, MAX_NEW_TOKENS)]


def build(config_class, tmp_path, **settings):
    return config_class(output_dir=str(tmp_path), report_to="none", use_cpu=True, **settings)


def test_every_config_class_has_the_views():
    """A subclass that declared a TRL name again as a plain field would store it twice: each class keeps the view."""
    for config_class in CONFIGS:
        for synonym in config_class.synonyms:
            assert inspect.getattr_static(config_class, synonym.trl_name) is synonym, (config_class, synonym)
    assert OnlineDPOConfig.synonyms == (*SYNONYMS, MAX_NEW_TOKENS)


@pytest.mark.parametrize("config_class, synonym", CASES, ids=lambda v: getattr(v, "trl_name", None))
def test_a_trl_name_is_stored_once_and_reads_and_writes_steadyrls(tmp_path, config_class, synonym):
    value = VALUES[synonym.own_name]
    config = build(config_class, tmp_path, **{synonym.trl_name: value})
    assert getattr(config, synonym.trl_name) == getattr(config, synonym.own_name) == value
    assert vars(config)[synonym.own_name] == value
    assert not {s.trl_name for s in config_class.synonyms} & set(vars(config)), "a TRL name holds a value of its own"
    setattr(config, synonym.trl_name, value * 2)  # as a script or a TRL-style callback would
    assert getattr(config, synonym.own_name) == value * 2
    setattr(config, synonym.own_name, value)
    assert getattr(config, synonym.trl_name) == value


def test_epsilon_set_after_construction_is_the_cliprange_the_loss_reads(tmp_path):
    args = build(GRPOConfig, tmp_path, epsilon=0.3)
    assert (args.epsilon, args.cliprange, args.epsilon_high, args.cliprange_high) == (0.3, 0.3, 0.3, 0.3)
    args.epsilon = 0.25
    assert args.cliprange == 0.25 and POLICY_LOSSES[args.loss_type].from_config(args).objective.cliprange == 0.25


def test_trl_names_read_steadyrls_defaults(tmp_path):
    args = build(RLOOConfig, tmp_path, n_samples_per_prompt=2)
    assert (args.num_generations, args.num_iterations, args.epsilon, args.epsilon_high) == (2, 1, 0.2, 0.2)
    assert build(OnlineDPOConfig, tmp_path).max_new_tokens == 64


def test_contradictions_are_refused_as_before(tmp_path):
    with pytest.raises(ValueError) as err:
        build(GRPOConfig, tmp_path, epsilon=0.1, cliprange=0.2)
    assert str(err.value) == (
        "epsilon=0.1 contradicts cliprange=0.2: both set the clipping range of the importance ratio; give one of them."
    )
    with pytest.raises(ValueError, match=r"^max_new_tokens=32 contradicts max_completion_length=64: both set"):
        build(OnlineDPOConfig, tmp_path, max_new_tokens=32, max_completion_length=64)
    with pytest.raises(ValueError, match=r"^max_new_tokens=0 is invalid: it must be a positive integer\.$"):
        build(OnlineDPOConfig, tmp_path, max_new_tokens=0)


def test_replace_deepcopy_and_pickle_round_trip(tmp_path):
    config = build(GRPOConfig, tmp_path, epsilon=0.3, num_generations=4, per_device_train_batch_size=4)
    again = dataclasses.replace(config)  # passes epsilon=0.3 and cliprange=0.3 again: no contradiction
    assert all(getattr(again, f.name) == getattr(config, f.name) for f in dataclasses.fields(config))
    assert dataclasses.replace(config, epsilon=0.3, cliprange=0.3).cliprange == 0.3
    for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
        assert (copied.epsilon, copied.cliprange, copied.num_generations) == (0.3, 0.3, 4)
        copied.epsilon = 0.1
        assert (copied.cliprange, config.cliprange, config.epsilon) == (0.1, 0.3, 0.3)


def test_dict_and_fingerprint_hold_each_setting_once(tmp_path):
    config = build(GRPOConfig, tmp_path, epsilon=0.3)
    assert config.to_dict()["epsilon"] == config.to_dict()["cliprange"] == 0.3, "TRL-style trackers read epsilon"
    assert '"epsilon": 0.3' in config.to_json_string()
    fixed, _ = split_settings(config)
    assert fixed["args.cliprange"] == 0.3
    assert not {f"args.{s.trl_name}" for s in (*SYNONYMS, MAX_NEW_TOKENS)} & set(fixed)


def test_the_fields_and_flags_are_unchanged():
    spec = {f.name: f for f in dataclasses.fields(GRPOConfig)}["epsilon"]
    assert spec.default is None and spec.init and spec.metadata["help"] == "TRL's name of cliprange."
    assert isinstance(inspect.getattr_static(GRPOConfig, "epsilon"), Synonym) and GRPOConfig.epsilon is None
    action = next(a for a in HfArgumentParser(GRPOConfig)._actions if a.dest == "epsilon")
    assert (action.default, action.type, action.help) == (None, float, "TRL's name of cliprange.")


def test_command_line_and_yaml_take_trls_names(tmp_path):
    argv = ["--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "--num_generations", "4"]
    (config,) = HfArgumentParser(RLOOConfig).parse_args_into_dataclasses(args=[*argv, "--epsilon", "0.3"])
    assert (config.n_samples_per_prompt, config.num_generations, config.cliprange) == (4, 4, 0.3)
    settings = tmp_path / "grpo.yaml"
    settings.write_text(f"output_dir: {tmp_path}\nreport_to: none\nuse_cpu: true\nnum_generations: 4\nepsilon: 0.3\n")
    _, config = parse(GRPOConfig, ["--config", str(settings), "--toy", "--num_iterations", "2"])
    assert (config.n_samples_per_prompt, config.cliprange, config.num_ppo_epochs) == (4, 0.3, 2)
    assert not {"num_generations", "epsilon", "num_iterations"} & set(vars(config))


def test_old_ppo_names_are_views_of_beta_and_max_completion_length(tmp_path):
    args = PPOConfig(output_dir=str(tmp_path), kl_coef=0.1, response_length=24)
    assert (args.beta, args.max_completion_length) == (0.1, 24)
    assert "kl_coef" not in vars(args) and "response_length" not in vars(args)
    args.kl_coef = 0.2
    assert args.beta == 0.2 and args.kl_coef == 0.2
    with pytest.raises(ValueError, match=r"kl_coef=0.1 contradicts beta=0.3: both set the KL coefficient"):
        PPOConfig(output_dir=str(tmp_path), kl_coef=0.1, beta=0.3)
