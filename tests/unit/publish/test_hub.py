"""The Hub model card (steadyrl/publish/hub.py): the base model named when it is a Hub model and never as a local
path, the run's final metrics (the last logged entry with a reward), and the Hub's metadata header. Pushes to a local
Hub stand-in: tests/integration/publish/test_hub.py."""

from __future__ import annotations

from steadyrl.publish.hub import final_metrics, hub_model_name, model_card

LOG_HISTORY = [
    {"reward": 0.1, "kl": 0.0, "loss": 1.0, "step": 1},
    {"reward": 0.75, "kl": 0.02, "loss": 0.5, "learning_rate": 1e-6, "step": 2},
    {"train_runtime": 12.0, "step": 2},  # the run's summary: no reward
]


def test_the_card_names_a_hub_base_model_the_dataset_and_the_final_metrics():
    metrics = final_metrics(LOG_HISTORY)
    assert metrics == {"reward": 0.75, "kl": 0.02, "loss": 0.5}
    card = model_card("someone/toy-grpo", "Qwen/Qwen2.5-0.5B", "grpo", "trl-lib/tldr", 2, metrics)
    header = card.split("---")[1]
    assert "base_model: Qwen/Qwen2.5-0.5B" in header and "- grpo" in header and "- trl-lib/tldr" in header
    assert "# toy-grpo" in card and "2 optimizer steps from\n`Qwen/Qwen2.5-0.5B`" in card
    assert "| reward | 0.75 |" in card and "| kl | 0.02 |" in card


def test_a_local_base_model_never_reaches_the_card(tmp_path):
    local = tmp_path / "my-model"
    local.mkdir()
    for path in (str(local), "./checkpoints/run", "~/models/x", "/abs/path", "a/b/c"):
        assert hub_model_name(path) is None, path
        card = model_card("someone/x", path, "rloo", None, 3, {})
        assert path not in card and "base_model" not in card and "a local model" in card
    assert hub_model_name("gpt2") == "gpt2" and hub_model_name("org/name") == "org/name"
    assert "| (none logged) | |" in model_card("someone/x", None, "rloo", None, 3, {})
