"""Train online DPO with steadyrl.

    python examples/online_dpo.py --toy --output_dir online-dpo-toy --max_steps 50      # the embedded toy task
    python examples/online_dpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name my/prompts \\
        --reward_funcs my_rewards:score --output_dir online-dpo-qwen --learning_rate 1e-6   # your own model and data
    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/online_dpo.py ...
    python examples/online_dpo.py cfg.yaml                                        # all fields from a YAML file

Re-run the same command with ``--resume_from_checkpoint true`` after an interruption.
The judge: of the two completions of a prompt, the one with the higher reward wins. Rewards:
``--reward_funcs module:function`` (TRL's calling convention; several may follow the flag) and/or
``--reward_model_name_or_path``; ``--toy`` scores with ``steadyrl.toy.letters_reward``. For a pairwise judge,
call ``train(*ALGORITHMS["online-dpo"], judge=my_judge)`` below.
"""

from steadyrl import ALGORITHMS
from steadyrl.cli.train import train

if __name__ == "__main__":
    train(*ALGORITHMS["online-dpo"])
