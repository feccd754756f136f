"""Train RLOO with steadyrl.

    python examples/rloo.py --output_dir rloo-toy --max_steps 50                       # the embedded toy task
    python examples/rloo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name my/prompts --output_dir rloo-qwen --learning_rate 1e-6          # your own model and data
    accelerate launch examples/rloo.py ...                                             # the same, launched
    python examples/rloo.py cfg.yaml                                                   # all fields from a YAML file

Re-run the same command with ``--resume_from_checkpoint true`` after an interruption.
The toy task's reward is ``steadyrl.toy.letters_reward``; with your own data, edit ``reward_funcs`` below.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from datasets import load_dataset
from transformers import HfArgumentParser

from steadyrl import RLOOConfig, RLOOTrainer
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path


@dataclass
class ScriptArguments:
    model_name_or_path: str | None = field(default=None, metadata={"help": "Model path or Hub name; default: toy."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset with a 'prompt' column; default: toy."})
    dataset_split: str = field(default="train")


def main() -> None:
    parser = HfArgumentParser((ScriptArguments, RLOOConfig))
    if len(sys.argv) == 2 and sys.argv[1].endswith((".yaml", ".yml")):
        script, config = parser.parse_yaml_file(sys.argv[1])
    else:
        script, config = parser.parse_args_into_dataclasses()
    model = script.model_name_or_path or toy_model_path()
    if script.dataset_name:
        dataset = load_dataset(script.dataset_name, split=script.dataset_split)
    else:
        dataset = toy_dataset()
    trainer = RLOOTrainer(model=model, args=config, train_dataset=dataset, reward_funcs=[letters_reward])
    trainer.train()
    trainer.save_model(f"{config.output_dir}/actor")


if __name__ == "__main__":
    main()
