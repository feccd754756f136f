"""GRPO's log_completions_hub_repo (TRL's): each logging step's completions reach a Hub dataset repository (the
stand-in in support/hub_server.py), equal to completions.jsonl's rows; a failing Hub never stops training nor costs a
checkpoint."""

import io
import json
import logging

import pyarrow.parquet as pq
from support.toy_run import make_trainer

REPO = "someone/toy-completions"


def train(tmp_path, **overrides):
    settings = dict(max_steps=4, save_steps=4, num_ppo_epochs=1, log_completions=True, logging_steps=1)
    trainer = make_trainer(tmp_path / "run", algorithm="grpo", log_completions_hub_repo=REPO, **settings, **overrides)
    trainer.train()
    return trainer


def jsonl_rows(tmp_path, step: int) -> list[dict]:
    lines = (tmp_path / "run" / "completions.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["step"] == step]


def test_each_logging_step_pushes_its_completions_to_a_dataset_repo(hub, tmp_path):
    train(tmp_path, hub_private_repo=True)
    assert hub.repos == {REPO: {"visibility": "private", "type": "dataset"}}
    assert [(c.repo_type, sorted(c.files)) for c in hub.commits] == [
        ("dataset", ["README.md", "completions_00001.parquet"]),
        ("dataset", ["completions_00003.parquet"]),  # a rollout is 2 steps: its completions are logged once
    ]
    assert {"trl", "trl-logs", "completions"} <= set(hub.card_metadata[0]["tags"])
    for step in (1, 3):
        table = pq.read_table(io.BytesIO(hub.files(REPO)[f"completions_{step:05d}.parquet"])).to_pylist()
        expected = jsonl_rows(tmp_path, step)
        assert len(table) == len(expected) == 8  # 4 prompts x 2 completions
        for pushed, row in zip(table, expected):
            assert pushed["step"] == step and pushed["advantage"] == row["advantage"]
            assert (pushed["prompt"], pushed["completion"]) == (row["prompt"], row["completion"])
            assert {name: pushed[name] for name in row["rewards"]} == row["rewards"]  # TRL: a column per function


def test_a_failing_hub_costs_a_warning_not_the_run(hub, tmp_path, caplog):
    hub.fail_next(1, 503, path="/api/repos/create")  # creating the repository fails at step 1, not at step 3
    with caplog.at_level(logging.WARNING):
        trainer = train(tmp_path)
    assert trainer.state.global_step == 4 and (tmp_path / "run" / "checkpoint-4" / "manifest.json").is_file()
    warnings = [r.getMessage() for r in caplog.records if "completions of step 1" in r.getMessage()]
    assert len(warnings) == 1 and "Training goes on" in warnings[0], warnings
    assert [sorted(c.files) for c in hub.commits] == [["README.md", "completions_00003.parquet"]]  # step 3 pushed
    assert len(jsonl_rows(tmp_path, 1)) == 8  # the rows of step 1 stay in completions.jsonl


def test_a_refused_token_stops_the_pushes_with_one_warning(hub, tmp_path, caplog):
    hub.fail_next(1, 401, path="/preupload")
    with caplog.at_level(logging.WARNING):
        trainer = train(tmp_path, hub_token="hf_refused")
    assert trainer.state.global_step == 4 and not hub.commits
    warnings = [r.getMessage() for r in caplog.records if "log_completions_hub_repo" in r.getMessage()]
    assert len(warnings) == 1 and "refused the token" in warnings[0], warnings
