"""Conversational datasets in TRL's convention, for every trainer with HF generate and vLLM; prompt truncation; the
completion log through a real report_to integration."""

import pytest
from transformers import AutoTokenizer

from steadyrl import ALGORITHMS
from steadyrl.toy import chat_dataset, chat_model_path, letters_in_answer

SMALL = dict(
    rollout_batch_size=4,
    train_batch_size=8,
    micro_train_batch_size=4,
    micro_rollout_batch_size=8,
    max_completion_length=12,
    max_steps=2,
    save_steps=2,
    logging_steps=1,
    report_to="none",
    disable_tqdm=True,
    seed=0,
    learning_rate=1e-4,
)


def chat_trainer(output_dir, algorithm, reward_funcs, **overrides):
    config_class, trainer_class = ALGORITHMS[algorithm]
    settings = {**SMALL, "n_samples_per_prompt": 2, **overrides}
    return trainer_class(
        chat_model_path(),
        args=config_class(output_dir=str(output_dir), **settings),
        train_dataset=chat_dataset("train"),
        reward_funcs=reward_funcs,
    )


@pytest.mark.parametrize("use_vllm", [False, True], ids=["hf", "vllm"])
@pytest.mark.parametrize("algorithm", ["rloo", "ppo", "online-dpo"])
def test_every_trainer_trains_on_conversations_with_trls_reward_arguments(tmp_path, algorithm, use_vllm):
    seen = []

    def recording(prompts, completions, letters, **kwargs):
        seen.append((prompts, completions))
        return letters_in_answer(completions, letters)

    trainer = chat_trainer(tmp_path, algorithm, [recording], use_vllm=use_vllm, vllm_dtype="float32")
    trainer.train()
    assert trainer.state.global_step == 2
    prompts, completions = seen[0]
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts), "prompts are the message lists"
    assert all(len(c) == 1 and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in completions)
    dataset_prompts = [p for p in chat_dataset("train")["prompt"]]
    assert all(p in dataset_prompts for p in prompts)
    if use_vllm:  # the engine sampled from the rendered conversation the trainer scores
        assert trainer.state.log_history[0]["generation_logprob_diff"] < 1e-4


def test_a_judge_reads_the_rendered_conversation_and_completion_texts(tmp_path):
    seen = []

    def judge(prompts, pairs):
        seen.append((prompts, pairs))
        return [0] * len(pairs)

    config_class, trainer_class = ALGORITHMS["online-dpo"]
    trainer = trainer_class(
        chat_model_path(),
        args=config_class(output_dir=str(tmp_path), **SMALL),
        train_dataset=chat_dataset("train"),
        judge=judge,
    )
    trainer.train()
    prompts, pairs = seen[0]
    tokenizer = AutoTokenizer.from_pretrained(chat_model_path())
    rendered = {
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in chat_dataset("train")["prompt"]
    }
    assert all(p in rendered for p in prompts) and all(isinstance(c, str) for pair in pairs for c in pair)


def test_prompts_longer_than_max_prompt_length_are_cut_counted_and_warned_about_once(tmp_path, caplog):
    trainer = chat_trainer(tmp_path, "rloo", [letters_in_answer], max_prompt_length=20, max_steps=4)
    trainer.train()
    shares = [log["prompts_truncated"] for log in trainer.state.log_history if "prompts_truncated" in log]
    assert shares and all(share == 1.0 for share in shares), "every rendered chat prompt is longer than 20 tokens"
    assert caplog.text.count("longer than max_prompt_length=20") == 1


def test_completions_reach_tensorboard_as_text_at_each_rollouts_first_logging_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers.integrations import TensorBoardCallback

    trainer = chat_trainer(
        tmp_path,
        "rloo",
        [letters_in_answer],
        report_to=["tensorboard"],
        log_completions=True,
        max_steps=4,
        rollout_batch_size=8,
    )
    trainer.train()
    board = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TensorBoardCallback))
    events = EventAccumulator(board.logging_dir, size_guidance={"tensors": 0}).Reload()
    texts = events.Tensors("completions/text_summary")
    assert [event.step for event in texts] == [1, 3], "one table per rollout (2 optimizer steps each)"
    table = texts[0].tensor_proto.string_val[0].decode()
    assert "letters_in_answer" in table and "assistant" in table


def test_the_printed_completions_show_each_prompts_question_not_its_system_message(tmp_path, capsys, monkeypatch):
    from datasets import Dataset

    monkeypatch.setenv("COLUMNS", "200")
    system = {"role": "system", "content": "You answer with the letters of the word you are asked about. " * 3}
    words = ["qwer", "asdf", "zxcv", "tyui"]
    rows = [
        {"prompt": [system, {"role": "user", "content": f"Which letters are in {word}?"}], "letters": word}
        for word in words
    ]
    config_class, trainer_class = ALGORITHMS["rloo"]
    args = config_class(
        output_dir=str(tmp_path),
        **{**SMALL, "n_samples_per_prompt": 2, "max_steps": 1},
        log_completions=True,
        num_completions_to_print=8,
        shuffle_dataset=False,
    )
    trainer = trainer_class(
        chat_model_path(), args=args, train_dataset=Dataset.from_list(rows), reward_funcs=[letters_in_answer]
    )
    trainer.train()
    out = capsys.readouterr().out
    assert all(out.count(f"Which letters are in {word}?") == 2 for word in words), out
    assert "You answer with" not in out
