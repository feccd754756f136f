"""Which setting names hold secrets (tokens, keys, passwords), and values without them: never recorded or shown."""

from __future__ import annotations

import re

SPECIAL_TOKEN_NAMES = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}
SECRET_WORDS = {
    "password",
    "passwd",
    "secret",
    "secrets",
    "apikey",
    "credential",
    "credentials",
    "auth",
    "authorization",
    "cookie",
    "cookies",
    "bearer",
    "pwd",
}
SECRET_LAST_WORDS = {"token", "key"}  # hub_token, openai_key, server_key, key; not key_column or keep_last
SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key")}  # also inside a longer name: aws_access_key_id


def is_secret(name: str) -> bool:
    """Whether a setting named ``name`` holds a secret: a token (not a tokenizer's special token such as
    ``pad_token``), a key (``openai_key``, ``server_key``; not ``key_column``), an API or access key, a password, a
    secret, credentials, an authorization or bearer header or cookies. ``apiKey`` and ``X-Api-Key`` read as
    ``api_key``."""
    key = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.rsplit(".", 1)[-1]).lower().replace("-", "_")
    words = key.split("_")
    if key in SPECIAL_TOKEN_NAMES:
        return False
    pairs = set(zip(words, words[1:]))
    return words[-1] in SECRET_LAST_WORDS or bool(SECRET_WORDS & set(words)) or bool(SECRET_PAIRS & pairs)


def redact_secrets(value):
    """``value`` without the entries of any dict, at any depth, whose key names a secret (``is_secret``); a dict that
    held only secrets becomes None, so that adding, changing or removing a token changes nothing."""
    if isinstance(value, dict):
        kept = {k: redact_secrets(v) for k, v in value.items() if not (isinstance(k, str) and is_secret(k))}
        return None if value and not kept else kept
    if isinstance(value, (list, tuple)):
        return [redact_secrets(item) for item in value]
    return value
