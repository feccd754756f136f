"""TRL's ``log_completions_hub_repo`` (GRPO): the completion log pushed to a Hub dataset repository
(publish/completions.py pushes it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class CompletionsHubOptions:
    """The Hub dataset that receives the completion log, as TRL's ``GRPOConfig.log_completions_hub_repo``.

    Example::

        GRPOConfig(output_dir="out", log_completions=True, log_completions_hub_repo="me/run-completions")
    """

    settings_group: ClassVar[str] = "GRPO's completion log on the Hub"

    log_completions_hub_repo: str | None = field(
        default=None,
        metadata={
            "help": "With log_completions: the Hugging Face Hub dataset repository ('user/name', or 'name' in the "
            "logged-in user's namespace; created if needed, public unless hub_private_repo=True) that receives each "
            "logging step's completions as completions_<step>.parquet, as TRL's. The main process commits each "
            "logging step's file when it is logged (TRL: every 2 minutes); a failed push logs a warning and "
            "training goes on."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        repo = self.log_completions_hub_repo
        if repo is None:
            return
        if not self.log_completions:
            raise ValueError(
                f"log_completions_hub_repo={repo!r} is set, but log_completions is False. Enable log_completions to "
                "upload completions to the Hub, or unset log_completions_hub_repo."
            )
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(repo)
        except HFValidationError:
            raise ValueError(
                f"log_completions_hub_repo={repo!r} is invalid: give a Hub dataset repository as 'user/name' or "
                "'name' (letters, digits, '-', '_' and '.')."
            ) from None
