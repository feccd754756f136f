"""The fingerprint's parts on their own: callable identities that tell apart what a name does not, DeepSpeed's
sections, secrets left out of the recorded settings and of the errors a resume check raises, and the weights'
digest."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from support.toy_run import make_config

from steadyrl.checkpoint import CheckpointError
from steadyrl.checkpoint.fingerprint import (
    callable_identity,
    check_resumable,
    deepspeed_identity,
    evenly_spaced,
    weights_digest,
)
from steadyrl.toy import letters_reward
from steadyrl.trainers.config.resume_settings import split_settings

SECRET, OTHER_SECRET = "hf_FirstSecretToken", "hf_SecondSecretToken"


def scaled_letters(completions, letters, scale, **kwargs) -> list[float]:
    return [scale * value for value in letters_reward(completions, letters)]


ZEROS = lambda completions, **kwargs: [0.0] * len(completions)  # noqa: E731
ONES = lambda completions, **kwargs: [1.0] * len(completions)  # noqa: E731


def closure(scale):
    def reward(completions, **kwargs):
        return [scale] * len(completions)

    return reward


class Scaled:
    def __init__(self, scale, api_key=None):
        self.scale, self.api_key = scale, api_key

    def __call__(self, completions, **kwargs):
        return [self.scale] * len(completions)

    def reward(self, completions, **kwargs):
        return [-self.scale] * len(completions)


def test_callables_are_told_apart_where_their_names_are_not():
    assert callable_identity(letters_reward) == "steadyrl.toy.task.letters_reward"  # a name identifies it
    same_name = {
        "partial": (functools.partial(scaled_letters, scale=1.0), functools.partial(scaled_letters, scale=2.0)),
        "lambda": (ZEROS, ONES),
        "closure": (closure(1.0), closure(2.0)),
        "callable object": (Scaled(1.0), Scaled(2.0)),
        "bound method": (Scaled(1.0).reward, Scaled(2.0).reward),
    }
    for kind, (one, other) in same_name.items():
        assert callable_identity(one) != callable_identity(other), kind
    rebuilt = {
        "partial": functools.partial(scaled_letters, scale=1.0),
        "closure": closure(1.0),
        "callable object": Scaled(1.0),
        "bound method": Scaled(1.0).reward,
    }
    for kind, func in rebuilt.items():
        assert callable_identity(func) == callable_identity(same_name[kind][0]), kind
    assert "scale=2.0" in callable_identity(functools.partial(scaled_letters, scale=2.0))
    assert '"1": "a"' in callable_identity(functools.partial(scaled_letters, table={1: "a", "b": 2}))  # any keys


def test_secrets_given_to_a_callable_are_left_out_of_its_identity():
    identity = callable_identity(functools.partial(scaled_letters, scale=1.0, api_token=SECRET))
    assert SECRET not in identity and "scale=1.0" in identity
    assert SECRET not in callable_identity(Scaled(1.0, api_key=SECRET))
    headers = {"Authorization": f"Bearer {SECRET}", "Accept": "json"}  # as an HTTP client keeps them
    assert callable_identity(Scaled(headers)) == callable_identity(Scaled({**headers, "Authorization": "Bearer x"}))


def test_deepspeed_identity_records_optimizer_offload_and_the_configs_optimizer_and_scheduler():
    plain = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0}
    assert deepspeed_identity(plain) == {
        "deepspeed.offload_optimizer": "none",
        "deepspeed.optimizer": None,
        "deepspeed.scheduler": None,
    }
    offload = {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu"},
        }
    }
    assert deepspeed_identity(offload)["deepspeed.offload_optimizer"] == "cpu"
    scheduler = {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}
    optimizer = {"type": "AdamW", "params": {"lr": 1e-3}}
    sections = deepspeed_identity({**plain, "scheduler": scheduler, "optimizer": optimizer})
    assert sections["deepspeed.scheduler"] == scheduler and sections["deepspeed.optimizer"] == optimizer
    assert deepspeed_identity(None) == {}


def test_secrets_are_left_out_of_the_settings_wherever_they_are_nested():
    kwargs = {
        "dtype": "float32",
        "token": SECRET,
        "extra": {"api_key": SECRET, "db_password": SECRET, "client_secret": SECRET, "pad_token": "<pad>"},
    }
    fixed, free = split_settings(make_config("out", model_init_kwargs=kwargs))
    assert SECRET not in json.dumps([fixed, free])
    assert fixed["args.model_init_kwargs"] == {"dtype": "float32", "extra": {"pad_token": "<pad>"}}
    only_token, _ = split_settings(make_config("out", model_init_kwargs={"token": SECRET}))
    assert only_token["args.model_init_kwargs"] is None  # the same as no model_init_kwargs: a token is not math


def test_the_settings_report_to_trackers_receive_hold_no_secret(tmp_path):
    # W&B, TensorBoard, ... get args.to_sanitized_dict() / to_dict(): TrainingArguments masks only top-level tokens
    config = make_config(tmp_path, model_init_kwargs={"dtype": "float32", "token": SECRET}, hub_token=SECRET)
    for settings in (config.to_dict(), config.to_sanitized_dict(), config.to_json_string()):
        assert SECRET not in json.dumps(settings)
    assert config.to_dict()["model_init_kwargs"] == {"dtype": "float32", "token": "<REDACTED>"}
    assert config.model_init_kwargs["token"] == SECRET  # the run itself still uses it


def test_a_checkpoint_that_recorded_a_secret_resumes_with_another_and_errors_do_not_print_it(tmp_path):
    current, _ = split_settings(make_config("out", model_init_kwargs={"token": OTHER_SECRET}))
    saved = {**current, "args.model_init_kwargs": {"token": SECRET}}  # as an older steadyrl wrote it
    check_resumable(saved, current, {}, {}, tmp_path)
    changed = {**current, "args.learning_rate": 0.5}
    with pytest.raises(CheckpointError, match="learning_rate") as error:
        check_resumable(saved, changed, {}, {}, tmp_path)
    assert SECRET not in str(error.value) and OTHER_SECRET not in str(error.value)


@pytest.mark.parametrize("name", ["key", "openai_key", "server_key", "bearer", "pwd"])
def test_a_refused_resume_never_shows_a_key_named_like_these(tmp_path, name):
    kwargs = {"dtype": "float32", "extra": {name: SECRET, "keep_last": 2}}
    saved, saved_free = split_settings(make_config("out", model_init_kwargs=kwargs, learning_rate=0.1))
    assert SECRET not in json.dumps([saved, saved_free]), "written to the checkpoint"
    assert saved["args.model_init_kwargs"]["extra"] == {"keep_last": 2}, "a setting named keep_* is recorded"
    kwargs = {"dtype": "float32", "extra": {name: OTHER_SECRET, "keep_last": 2}}
    current, current_free = split_settings(make_config("out", model_init_kwargs=kwargs, learning_rate=0.1))
    check_resumable(saved, current, saved_free, current_free, tmp_path)  # another key is not another run
    changed, _ = split_settings(make_config("out", model_init_kwargs=kwargs, learning_rate=0.5))
    reward = functools.partial(scaled_letters, scale=1.0, **{name: OTHER_SECRET})
    changed["reward_funcs[0]"] = callable_identity(reward)
    saved["reward_funcs[0]"] = callable_identity(functools.partial(scaled_letters, scale=2.0, **{name: SECRET}))
    with pytest.raises(CheckpointError, match="learning_rate: checkpoint 0.1, now 0.5") as error:
        check_resumable(saved, changed, saved_free, current_free, tmp_path)
    assert "scale=2.0" in str(error.value), "the changed reward function is named"
    assert SECRET not in str(error.value) and OTHER_SECRET not in str(error.value)


def test_the_weight_digest_samples_a_real_embedding_up_to_its_last_element():
    """An embedding of SmolLM2's shape, 49,152 x 576 = 28,311,552 elements (past 2**24, where float32 index steps
    round past the end): every trainer crashed at construction computing this digest."""
    size = 49152 * 576
    index = evenly_spaced(size, 64)
    assert index.dtype == torch.int64 and index[0] == 0 and index[-1] == size - 1 and len(set(index.tolist())) == 64
    embedding = torch.nn.Embedding(49152, 576, _weight=torch.zeros(49152, 576))
    before = weights_digest(embedding)
    with torch.no_grad():
        embedding.weight[-1, -1] = 1.0  # the last element is one of the sampled values
    assert weights_digest(embedding) != before


def test_a_resume_on_more_processes_names_micro_batch_sizes_that_work_there_or_says_none_does(tmp_path):
    saved = {"args.rollout_batch_size": 4, "args.n_samples_per_prompt": 2, "args.micro_rollout_batch_size": 8}
    current = {**saved, "args.micro_rollout_batch_size": 4}
    with pytest.raises(CheckpointError) as err:
        check_resumable(saved, current, {"world_size": 1}, {"world_size": 2}, tmp_path)
    assert "does not divide the 4 samples each of 2 processes generates" in str(err.value)
    assert "resume on 1" in str(err.value) and "set micro_rollout_batch_size=8" not in str(err.value)
    saved = {**saved, "args.micro_rollout_batch_size": 4}
    with pytest.raises(CheckpointError, match="set micro_rollout_batch_size=4 to resume on 2"):
        check_resumable(
            saved, {**saved, "args.micro_rollout_batch_size": 2}, {"world_size": 1}, {"world_size": 2}, tmp_path
        )
