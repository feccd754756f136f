"""Train online DPO with steadyrl.

    python examples/online_dpo.py --output_dir online-dpo-toy --max_steps 50            # the embedded toy task
    python examples/online_dpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name my/prompts --output_dir online-dpo-qwen --learning_rate 1e-6   # your own model and data
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/online_dpo.py ...
    python examples/online_dpo.py cfg.yaml                                        # all fields from a YAML file

Re-run the same command with ``--resume_from_checkpoint true`` after an interruption.
The toy task's judge is ``steadyrl.toy.letters_reward`` (the higher score wins the pair); with your own
data, edit ``reward_funcs`` below, or pass a pairwise ``judge=``.
"""

from steadyrl import OnlineDPOConfig, OnlineDPOTrainer
from steadyrl.scripts import train
from steadyrl.toy import letters_reward

if __name__ == "__main__":
    train(OnlineDPOConfig, OnlineDPOTrainer, reward_funcs=[letters_reward])
