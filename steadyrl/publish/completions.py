"""TRL's ``log_completions_hub_repo``: each logging step's completions pushed to a Hub dataset repository.

As TRL's GRPOTrainer: the repository is a dataset (created if needed, private with ``hub_private_repo``) with a card
tagged ``trl``, ``trl-logs``, ``completions``, and one ``completions_<step:05d>.parquet`` per logging step with
columns ``step``, ``prompt``, ``completion``, one per reward function (its name), ``advantage``. TRL writes those
files and commits them from a background thread every 2 minutes; steadyrl commits each step's file when it is logged,
from the main process. A Hub or network failure is a warning: training goes on, the rows stay in
``output_dir/completions.jsonl``, and the next logging step pushes its own file. A resumed run pushes the same file
names again, so the repository ends as an uninterrupted run's.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .hub import describe, hub_offline, network_errors, token_refused

logger = logging.getLogger(__name__)

CARD = """---
pretty_name: TRL Completion logs
tags:
- trl
- trl-logs
- completions
- steadyrl
---

# Completion logs

The completions a steadyrl run logged (`log_completions`), one `completions_<step>.parquet` file per logging step:
`step`, `prompt`, `completion`, each reward function's score under its name, and the `advantage` the loss used.
"""


def completion_columns(step: int, rows: Sequence[dict]) -> dict[str, list]:
    """TRL's completion table: ``step``, ``prompt``, ``completion``, each reward function's score under its name,
    ``advantage`` (None where the algorithm has none)."""
    names = list(dict.fromkeys(name for row in rows for name in row["rewards"]))
    columns: dict[str, list] = {
        "step": [step] * len(rows),
        "prompt": [row["prompt"] for row in rows],
        "completion": [row["completion"] for row in rows],
    }
    for name in names:
        columns[name] = [_float(row["rewards"].get(name)) for row in rows]
    columns["advantage"] = [_float(row.get("advantage")) for row in rows]
    return columns


def _float(value) -> float | None:
    return None if value is None else float(value)


class CompletionsHubPush:
    """Pushes each logging step's completion rows (``completion_rows``) to the Hub dataset ``repo_id``.

    Example::

        hub = CompletionsHubPush("me/run-completions", token=None, private=True)
        hub.push(step, rows)  # False (and a warning) if the Hub or the network failed
    """

    def __init__(self, repo_id: str, token: str | None = None, private: bool | None = None) -> None:
        self.repo_id, self.token, self.private = repo_id, token, private
        self.card_pushed = False
        self.stopped = ""  # why no more pushes are tried (offline, or a refused token), once said

    def push(self, step: int, rows: Sequence[dict]) -> bool:
        """Commit ``completions_<step:05d>.parquet`` (with the card the first time); False on a Hub failure."""
        if not rows or self.stopped:
            return False
        if hub_offline():
            self.stop(f"HF_HUB_OFFLINE is set, so the completions are not pushed to {self.repo_id!r}")
            return False
        from huggingface_hub import HfApi

        try:
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                write_parquet(folder / f"completions_{step:05d}.parquet", completion_columns(step, rows))
                api = HfApi(token=self.token)  # None: HF_TOKEN or the cached login
                if not self.card_pushed:
                    created = api.create_repo(self.repo_id, private=self.private, repo_type="dataset", exist_ok=True)
                    self.repo_id = created.repo_id  # 'name' alone: in the logged-in user's namespace
                    (folder / "README.md").write_text(CARD)
                message = f"Completions of step {step}"
                api.upload_folder(repo_id=self.repo_id, repo_type="dataset", folder_path=folder, commit_message=message)
        except network_errors() as err:
            if token_refused(err):
                self.stop(f"the Hub refused the token for {self.repo_id!r} ({describe(err)}); no further pushes")
            else:
                logger.warning(
                    f"Could not push the completions of step {step} to the Hub dataset {self.repo_id!r} "
                    f"({describe(err)}). Training goes on; they are in completions.jsonl, and the next logging step "
                    "pushes its own."
                )
            return False
        self.card_pushed = True
        return True

    def stop(self, why: str) -> None:
        self.stopped = why
        logger.warning(f"log_completions_hub_repo: {why}. Training goes on; completions.jsonl holds every row.")


def write_parquet(path: Path, columns: dict[str, list]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
