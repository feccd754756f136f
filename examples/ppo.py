"""Train PPO with steadyrl.

    python examples/ppo.py --toy --output_dir ppo-toy --max_steps 50      # the embedded toy task
    python examples/ppo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name my/prompts \\
        --reward_model_name_or_path my/reward-model --output_dir ppo-qwen --learning_rate 1e-6   # your own model
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/ppo.py ...
    python examples/ppo.py cfg.yaml                                        # all fields from a YAML file

Re-run the same command with ``--resume_from_checkpoint true`` after an interruption.
Rewards: ``--reward_funcs module:function`` (TRL's calling convention; several may follow the flag) and/or
``--reward_model_name_or_path``. ``--toy`` scores with ``steadyrl.toy.letters_reward``. The critic starts
from the reward model if one is given, else from the policy.
"""

from steadyrl import ALGORITHMS
from steadyrl.cli.train import train

if __name__ == "__main__":
    train(*ALGORITHMS["ppo"])
