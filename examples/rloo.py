"""Train RLOO with steadyrl.

    python examples/rloo.py --output_dir rloo-toy --max_steps 50            # the embedded toy task
    python examples/rloo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name my/prompts --output_dir rloo-qwen --learning_rate 1e-6   # your own model and data
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/rloo.py ...
    python examples/rloo.py cfg.yaml                                        # all fields from a YAML file

Re-run the same command with ``--resume_from_checkpoint true`` after an interruption.
The toy task's reward is ``steadyrl.toy.letters_reward``; with your own data, edit ``reward_funcs`` below.
"""

from steadyrl import RLOOConfig, RLOOTrainer
from steadyrl.scripts import train
from steadyrl.toy import letters_reward

if __name__ == "__main__":
    train(RLOOConfig, RLOOTrainer, reward_funcs=[letters_reward])
