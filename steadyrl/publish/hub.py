"""Publishing the actor to the Hugging Face Hub: the policy alone, in plain Hugging Face format, with a model card.

Never the critic, reward model, reference, optimizer, RNG or training arguments. The token comes from the
usual places (an explicit ``token``/``hub_token``, ``HF_TOKEN``, the cached login) and is only ever handed to
``huggingface_hub``.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..checkpoint import verify_checkpoint
from ..version import __version__
from .export import checkpoint_actor, copy_files, merge_adapter, regular_files


class HubPushError(RuntimeError):
    """Publishing the actor failed because of the Hub or the network; the message says where the actor is kept
    locally and the command that publishes it from there."""


def network_errors() -> tuple[type[Exception], ...]:
    """What a Hub request raises when the Hub or the network fails, as opposed to a programming error:
    ``HfHubHTTPError`` (5xx, 429, ...) and ``ConnectionError`` / ``TimeoutError`` / ``requests``' errors, all
    ``OSError``; and the HTTP client's own transport errors (httpx's, e.g. a connection dropped mid-request)."""
    from huggingface_hub import errors

    client_error = getattr(errors, "HTTPError", OSError)  # the base error of the HTTP client huggingface_hub uses
    return (OSError, client_error)


def hub_endpoint() -> str:
    """The Hub's address as huggingface_hub uses it (``HF_ENDPOINT``, default https://huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set: no request may reach the Hub."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}


def hub_failure(err: BaseException) -> str:
    """One line for a failed Hub request, naming the endpoint and the cause: it could not be reached (DNS,
    connection, timeout: no answer), or its HTTP answer (401/403: the token; 404; 5xx)."""
    status = getattr(getattr(err, "response", None), "status_code", None)
    what = "cannot be reached" if status is None else f"answered HTTP {status}"
    if status in (401, 403):
        what += " (the token is missing, invalid or cannot write there)"
    return f"the Hugging Face Hub at {hub_endpoint()} {what}: {describe(err)}"


def token_refused(err: BaseException) -> bool:
    """The Hub refused the token (401, 403): every later request with it fails the same way until it is fixed."""
    return getattr(getattr(err, "response", None), "status_code", None) in (401, 403)


def transient(err: BaseException) -> bool:
    """A Hub failure that a later attempt may not meet: it answered 5xx or 429 (busy, rate limit)."""
    status = getattr(getattr(err, "response", None), "status_code", None)
    return status is not None and (status >= 500 or status == 429)


def describe(err: BaseException) -> str:
    """``Type: first line of the message``: Hub errors append a URL of HTTP status explanations and the body."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else repr(err)}"


def push_command(
    directory: Path,
    repo_id: str,
    merged: bool | None = False,
    private: bool | None = False,
    revision: str | None = None,
) -> str:
    """The ``steadyrl push`` command line that publishes ``directory`` to ``repo_id``."""
    words = ["steadyrl", "push", str(directory), repo_id]
    words += ["--merged"] * bool(merged) + ["--private"] * bool(private)
    return shlex.join(words + (["--revision", revision] if revision else []))


def stage_actor(actor_dir: Path, out: Path, merged: bool, files: Iterable[str] | None = None) -> Path:
    """The files to publish from an actor's directory (a checkpoint's, or a saved model): a LoRA adapter as it is
    (``adapter_config.json`` + weights), or with ``merged`` merged into its base model.

    ``files`` (names relative to ``actor_dir``: of a checkpoint, the actor's files its manifest lists, never its
    optimizer or state files) are copied; by default the directory's regular files, never a symlink."""
    out.mkdir(parents=True, exist_ok=True)
    if merged and (actor_dir / "adapter_config.json").is_file():
        merge_adapter(actor_dir, out)
    else:
        copy_files(actor_dir, regular_files(actor_dir) if files is None else files, out)
        if (out / "adapter_config.json").is_file():
            name_base_model(out / "adapter_config.json")
    return out


def name_base_model(adapter_config: Path) -> None:
    """PEFT names an adapter's base model by the path it was loaded from: keep it only if it is a Hub id, as in the
    model card (a local path shows the user's directories and names no model anyone else can load)."""
    config = json.loads(adapter_config.read_text())
    config["base_model_name_or_path"] = hub_model_name(config.get("base_model_name_or_path"))
    adapter_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def actor_of(path: Path) -> tuple[Path, list[str]]:
    """The actor's directory of a checkpoint (verified against its manifest) or a saved actor directory, and the
    files to publish from it: the actor's files the manifest lists, or the saved directory's regular files."""
    if (path / "manifest.json").is_file() or (path / "manifest.json").is_symlink():
        return checkpoint_actor(path, verify_checkpoint(path))
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return path, regular_files(path)
    raise FileNotFoundError(
        f"{path} is neither a steadyrl checkpoint (no manifest.json) nor a saved actor (no config.json or "
        "adapter_config.json)."
    )


# logged by every trainer (reward, reward_std, kl, loss), RLOO and PPO (rlhf_reward), PPO (score), online DPO
# (rewards/accuracies: the share of pairs whose implicit-reward margin agrees with the judge)
CARD_METRICS = ("reward", "reward_std", "kl", "loss", "rlhf_reward", "score", "rewards/accuracies")


def final_metrics(log_history: list[dict]) -> dict[str, float]:
    """The card's metrics: those of the last logged entry that has a reward."""
    final = next((log for log in reversed(log_history) if "reward" in log), {})
    return {key: float(final[key]) for key in CARD_METRICS if key in final}


def hub_model_name(name_or_path: str | None) -> str | None:
    """``name_or_path`` if it names a model on the Hub (``org/name`` or ``name``), else None: a local path (one that
    exists here, or an absolute, relative or home path) must not reach a card, where it shows the user's directories
    and is no model the Hub knows."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not name_or_path or os.path.exists(os.path.expanduser(name_or_path)):
        return None
    try:
        validate_repo_id(name_or_path)  # refuses '/abs', './x', '~/x', 'a/b/c', backslashes
    except HFValidationError:
        return None
    return name_or_path


def model_card(
    repo_id: str, base_model: str | None, algorithm: str, dataset: str | None, steps: int, metrics: dict
) -> str:
    """README.md with the Hub's metadata header: base model (when it is a Hub model, never a local path), algorithm,
    dataset, steps, final metrics."""
    base_model = hub_model_name(base_model)
    header = ["---", "library_name: transformers", "tags:", "- steadyrl", f"- {algorithm}", "- reinforcement-learning"]
    if base_model:
        header.append(f"base_model: {base_model}")
    if dataset:
        header += ["datasets:", f"- {dataset}"]
    header.append("---")
    rows = "\n".join(f"| {name} | {value:.4g} |" for name, value in sorted(metrics.items()))
    body = f"""
# {repo_id.split("/")[-1]}

The actor (policy) of a steadyrl {algorithm.upper()} run: {steps} optimizer steps from
{f"`{base_model}`" if base_model else "a local model"} on {f"`{dataset}`" if dataset else "an unnamed dataset"}.

| final metric | value |
|---|---|
{rows or "| (none logged) | |"}

Trained with [steadyrl](https://github.com/steadyrl/steadyrl) {__version__}. Only the policy is published: no
critic, reward model, reference model or optimizer state.
"""
    return "\n".join(header) + "\n" + body


def upload(
    folder: Path,
    repo_id: str,
    token: str | None,
    message: str,
    path_in_repo: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
) -> str:
    """Create ``repo_id`` if needed and commit ``folder`` to it; return the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)  # None: HF_TOKEN or the cached login, as huggingface_hub decides
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    info = api.upload_folder(
        repo_id=repo_id, folder_path=folder, path_in_repo=path_in_repo, commit_message=message, revision=revision
    )
    return info.commit_url


def push_from_directory(
    source: Path, repo_id: str, token: str | None, merged: bool, private: bool, revision: str | None = None
) -> str:
    """``steadyrl push``: the actor of a checkpoint (or a saved actor) with a card made from the checkpoint's state."""
    actor, files = actor_of(source)
    steps, metrics, algorithm = 0, {}, "rl"
    if (source / "trainer_state.json").is_file():
        state = json.loads((source / "trainer_state.json").read_text())
        steps = state.get("global_step", 0)
        metrics = final_metrics(state.get("log_history", []))
    if (source / "steadyrl_state.json").is_file():
        algorithm = json.loads((source / "steadyrl_state.json").read_text())["fingerprint"]["algorithm"]
    config_file = actor / ("adapter_config.json" if (actor / "adapter_config.json").is_file() else "config.json")
    config = json.loads(config_file.read_text())
    base = config.get("base_model_name_or_path") or config.get("_name_or_path")
    with tempfile.TemporaryDirectory() as tmp:
        staged = stage_actor(actor, Path(tmp) / "staged", merged, files)
        (staged / "README.md").write_text(model_card(repo_id, base, algorithm, None, steps, metrics))
        return upload(staged, repo_id, token, f"Upload the actor of {source.name}", revision=revision, private=private)
