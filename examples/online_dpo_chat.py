"""Online DPO on a chat model and a conversational dataset, written with the names of TRL's online DPO
(``trl.experimental.online_dpo``): ``per_device_train_batch_size`` counts prompts, each sampled twice, and
``max_new_tokens`` is the completion length. TRL's own OnlineDPOConfig has no ``log_completions``; the rest runs
on TRL with the import swapped.

    python examples/online_dpo_chat.py --output_dir out/dpo-chat
    python examples/online_dpo_chat.py --output_dir out/dpo-chat --resume
"""

import argparse

from transformers import AutoTokenizer
from trl.rewards import think_format_reward

from steadyrl import OnlineDPOConfig, OnlineDPOTrainer
from steadyrl.toy import chat_dataset, chat_model_path


def letters_in_answer(completions, letters, **kwargs):
    """A conversational reward: the share of a completion's first 8 answer characters that are letters of the
    prompt's word; the higher total of the two completions of a prompt is the chosen one."""
    answers = [completion[0]["content"].split("</think>")[-1].strip()[:8] for completion in completions]
    return [sum(ch in word for ch in answer) / 8 for answer, word in zip(answers, letters)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="out/dpo-chat")
    parser.add_argument("--max_steps", type=int, default=6)
    parser.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    args = OnlineDPOConfig(
        output_dir=opts.output_dir,
        per_device_train_batch_size=4,  # prompts per forward/backward, 2 completions each
        gradient_accumulation_steps=2,
        max_new_tokens=16,
        beta=[0.1],
        learning_rate=1e-4,
        max_steps=opts.max_steps,
        save_steps=2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=16,
        log_completions=True,
        report_to="none",
        bf16=False,  # CPU
        seed=0,
    )
    trainer = OnlineDPOTrainer(
        model=chat_model_path(),
        reward_funcs=[think_format_reward, letters_in_answer],
        args=args,
        train_dataset=chat_dataset("train"),
        eval_dataset=chat_dataset("eval"),
        processing_class=AutoTokenizer.from_pretrained(chat_model_path()),
    )
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    trainer.save_model(f"{opts.output_dir}/actor")


if __name__ == "__main__":
    main()
