"""Which setting names hold secrets: never recorded in a checkpoint, shown in an error or sent to a tracker."""

import pytest

from steadyrl.redaction import is_secret

SECRETS = [
    "hub_token",
    "token",
    "key",
    "openai_key",
    "server_key",
    "api_key",
    "apiKey",
    "serverKey",
    "X-Api-Key",
    "aws_access_key_id",
    "bearer",
    "bearer_token",
    "pwd",
    "db_pwd",
    "db_password",
    "client_secret",
    "Authorization",
    "model_init_kwargs.openai_key",
]
NOT_SECRETS = [
    "pad_token",
    "eos_token",
    "pad_token_id",
    "max_new_tokens",
    "max_prompt_length",
    "keep_last",
    "keep_in_memory",
    "key_column",
    "keys_to_ignore",
    "keyword",
    "tokenizer_name",
    "monkey",
]


@pytest.mark.parametrize("name", SECRETS)
def test_names_of_tokens_keys_and_passwords_are_secrets(name):
    assert is_secret(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_special_tokens_and_ordinary_settings_are_not(name):
    assert not is_secret(name)
