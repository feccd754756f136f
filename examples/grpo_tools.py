"""Multi-turn GRPO with a tool on a real pretrained chat model: SmolLM2-135M-Instruct learns to call a calculator.

    python examples/grpo_tools.py                  # a short format warm-up, then 10 GRPO steps (HF generate)
    python examples/grpo_tools.py --vllm           # vLLM (colocated) instead

SmolLM2-135M-Instruct does not call tools on its own (asked with a tool in its prompt, it writes code or prose). The
script first teaches it the call format with a few supervised steps (``steadyrl.toy.tools.teach_tool_format``) on
conversations of which only ``--right_share`` call with the question's numbers (the others: random arguments), so its
calls parse but often add the wrong numbers. GRPO then trains
with ``environment_factory``: each rollout gets its own ``Calculator``, whose ``add`` method is the tool; the model's
call is parsed from its sampled tokens, run, and its result is appended as the tool's turn (those tokens are in the
trajectory but out of the loss); ``get_reward`` pays 1 when the model's call added the question's numbers. The logs
show ``tools/call_frequency``, ``tools/failure_frequency``, ``turns_per_rollout``, ``env_token_share`` and the
reward of each source.
"""

import argparse
import time

from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl import GRPOConfig, GRPOTrainer
from steadyrl.real import smollm2_path
from steadyrl.toy.tools import (
    RESPONSE_TEMPLATE,
    TOOL_CHAT_TEMPLATE,
    Calculator,
    correct_sum,
    sum_dataset,
    teach_tool_format,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="out/grpo-tools")
    parser.add_argument("--warmup_steps", type=int, default=30, help="supervised steps on the call format")
    parser.add_argument("--right_share", type=float, default=0.25, help="warm-up calls with the question's numbers")
    parser.add_argument("--max_steps", type=int, default=10)
    parser.add_argument("--prompts_per_step", type=int, default=4)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=1e-5)
    parser.add_argument("--vllm", dest="use_vllm", action="store_true")
    opts = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    tokenizer.chat_template, tokenizer.response_template = TOOL_CHAT_TEMPLATE, RESPONSE_TEMPLATE  # ChatML + tools
    model = AutoModelForCausalLM.from_pretrained(smollm2_path())
    start = time.time()
    teach_tool_format(
        model,
        tokenizer,
        steps=opts.warmup_steps,
        batch_size=8,
        learning_rate=5e-5,
        seed=0,
        right_share=opts.right_share,
    )
    print(f"call-format warm-up: {opts.warmup_steps} steps in {time.time() - start:.0f} s", flush=True)

    args = GRPOConfig(
        output_dir=opts.output_dir,
        num_generations=opts.num_generations,
        per_device_train_batch_size=opts.prompts_per_step * opts.num_generations,
        max_completion_length=96,  # the call (~30 tokens), the tool's turn and the answer
        max_tool_calling_iterations=1,
        learning_rate=opts.learning_rate,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        use_vllm=opts.use_vllm,
        vllm_dtype="float32",  # CPU; on a GPU leave vLLM's default (bfloat16)
        max_steps=opts.max_steps,
        save_steps=5,
        save_total_limit=1,
        logging_steps=1,
        report_to="none",
        bf16=False,  # CPU
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[correct_sum],
        args=args,
        train_dataset=sum_dataset(256),
        processing_class=tokenizer,
        environment_factory=Calculator,
    )
    start = time.time()
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    print(f"{len(steps)} GRPO steps in {(time.time() - start) / 60:.1f} min")
    for entry in steps:
        print(
            f"  step {entry['step']:2d}: calls/rollout {entry['tools/call_frequency']:.2f}, failed "
            f"{entry['tools/failure_frequency']:.2f}, turns {entry['turns_per_rollout']:.2f}, env tokens "
            f"{entry['env_token_share']:.2f}, right call {entry['rewards/Calculator']:.2f}, right answer "
            f"{entry['rewards/correct_sum']:.2f}"
        )
    trainer.save_model(f"{opts.output_dir}/actor")


if __name__ == "__main__":
    main()
