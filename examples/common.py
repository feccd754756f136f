"""What the example scripts share: script arguments, parsing (flags or a YAML file), model and dataset loading."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from datasets import load_dataset
from transformers import HfArgumentParser

from steadyrl.toy import toy_dataset, toy_model_path


@dataclass
class ScriptArguments:
    model_name_or_path: str | None = field(default=None, metadata={"help": "Model path or Hub name; default: toy."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset with a 'prompt' column; default: toy."})
    dataset_split: str = field(default="train")
    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A sequence classifier (num_labels=1) scoring completions, if any."}
    )


def parse(config_class) -> tuple[ScriptArguments, object]:
    """``ScriptArguments`` and the trainer config from command-line flags, or from a single YAML file argument."""
    parser = HfArgumentParser((ScriptArguments, config_class))
    if len(sys.argv) == 2 and sys.argv[1].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(sys.argv[1])
    return parser.parse_args_into_dataclasses()


def model_and_dataset(script: ScriptArguments):
    model = script.model_name_or_path or toy_model_path()
    if script.dataset_name:
        return model, load_dataset(script.dataset_name, split=script.dataset_split)
    return model, toy_dataset()


def train(config_class, trainer_class, **trainer_kwargs) -> None:
    """Parse the arguments, build the trainer, train (resuming if asked), save the actor to OUTPUT_DIR/actor."""
    script, config = parse(config_class)
    model, dataset = model_and_dataset(script)
    trainer = trainer_class(
        model=model, args=config, train_dataset=dataset, reward_model=script.reward_model_name_or_path,
        **trainer_kwargs,
    )  # fmt: skip
    trainer.train()
    trainer.save_model(f"{config.output_dir}/actor")
