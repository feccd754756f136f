"""A multi-turn GRPO script written for TRL 1.16 (as TRL's docs show tools and environment_factory), used by the tests
with only its trainer import changed to steadyrl's.

    python tests/support/trl_tool_script.py tools|environment MODEL_DIR OUTPUT_DIR

prints the run's ``log_history`` as one JSON line at the end.
"""

import json  # noqa: I001  (the trainer import stays one line of its own: the line a user changes)
import random
import sys

from datasets import Dataset
from trl import GRPOConfig
from trl import GRPOTrainer  # the line a user changes


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class CalculatorEnv:
    def reset(self, **kwargs) -> str | None:
        self.answer, self.results = int(kwargs["answer"]), []
        return " Use the tool."

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.results.append(a + b)
        return a + b

    def get_reward(self) -> float:
        return 1.0 if self.answer in self.results else 0.0


def correct(completions, answer, **kwargs):
    return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]


def main() -> None:
    kind, model, output_dir = sys.argv[1:4]
    rng = random.Random(0)
    rows = []
    for _ in range(8):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    args = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=2,
        max_completion_length=128,
        max_tool_calling_iterations=2,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        use_cpu=True,
    )
    agent = {"tools": [add]} if kind == "tools" else {"environment_factory": CalculatorEnv}
    trainer = GRPOTrainer(model=model, reward_funcs=correct, args=args, train_dataset=Dataset.from_list(rows), **agent)
    trainer.train()
    print(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main()
