"""Train RLOO with steadyrl.

    python examples/rloo.py --toy --output_dir rloo-toy --max_steps 50      # the embedded toy task
    python examples/rloo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name my/prompts \\
        --reward_funcs my_rewards:score --output_dir rloo-qwen --learning_rate 1e-6   # your own model and data
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/rloo.py ...
    python examples/rloo.py cfg.yaml                                        # all fields from a YAML file

Re-run the same command with ``--resume_from_checkpoint true`` after an interruption.
Rewards: ``--reward_funcs module:function`` (TRL's calling convention; several may follow the flag) and/or
``--reward_model_name_or_path``. ``--toy`` scores with ``steadyrl.toy.letters_reward``.
"""

from steadyrl import ALGORITHMS
from steadyrl.cli.train import train

if __name__ == "__main__":
    train(*ALGORITHMS["rloo"])
