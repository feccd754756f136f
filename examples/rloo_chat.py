"""RLOO on a chat model and a conversational dataset, written with TRL's names: swap the import for
``from trl import RLOOConfig, RLOOTrainer`` and the same script runs on TRL
(tests/integration/trl_compat/test_trl_scripts.py does both).

    python examples/rloo_chat.py --output_dir out/rloo-chat                # train 6 steps, evaluate every 2
    python examples/rloo_chat.py --output_dir out/rloo-chat --resume      # after an interruption

The embedded chat fixture (a tiny ChatML model and 64 + 16 conversational prompts, steadyrl.toy) stands in for
e.g. Qwen2.5-0.5B-Instruct and a Hub dataset: swap ``model=`` and the datasets for your own.
"""

import argparse

from trl.rewards import think_format_reward

from steadyrl import RLOOConfig, RLOOTrainer
from steadyrl.toy import chat_dataset, chat_model_path


def letters_in_answer(completions, letters, **kwargs):
    """A conversational reward: each completion is [{"role": "assistant", "content": ...}]; the share of its first
    8 answer characters that are letters of the prompt's word (the dataset's "letters" column)."""
    answers = [completion[0]["content"].split("</think>")[-1].strip()[:8] for completion in completions]
    return [sum(ch in word for ch in answer) / 8 for answer, word in zip(answers, letters)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="out/rloo-chat")
    parser.add_argument("--max_steps", type=int, default=6)
    parser.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    args = RLOOConfig(
        output_dir=opts.output_dir,
        num_generations=4,  # completions per prompt
        per_device_train_batch_size=8,  # completions per forward/backward
        gradient_accumulation_steps=1,
        steps_per_generation=2,  # one generation of 16 completions serves 2 optimizer steps
        max_completion_length=16,
        learning_rate=1e-4,
        beta=0.04,
        epsilon=0.2,
        epsilon_high=0.28,
        max_steps=opts.max_steps,
        save_steps=2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=16,
        log_completions=True,
        num_completions_to_print=2,
        report_to="none",
        bf16=False,  # CPU
        seed=0,
    )
    trainer = RLOOTrainer(
        model=chat_model_path(),
        reward_funcs=[think_format_reward, letters_in_answer],
        args=args,
        train_dataset=chat_dataset("train"),
        eval_dataset=chat_dataset("eval"),
    )
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    trainer.save_model(f"{opts.output_dir}/actor")


if __name__ == "__main__":
    main()
