"""The real-model fixture: SmolLM2-135M-Instruct from the package registry (``smollm2_path``) and a verifiable
arithmetic task for it (``arithmetic_dataset``, the rewards ``correct_answer`` and ``answer_format``,
``greedy_accuracy``). Tests, examples, the demo and the benchmarks use it; the trainers never import it."""

from .arithmetic import answer_format, arithmetic_dataset, correct_answer, final_number, greedy_accuracy
from .smollm2 import gguf_path, smollm2_path

__all__ = [
    "answer_format",
    "arithmetic_dataset",
    "correct_answer",
    "final_number",
    "gguf_path",
    "greedy_accuracy",
    "smollm2_path",
]
