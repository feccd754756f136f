"""Vision-language models trained with images in their prompts (TRL's ``image`` column, the model's processor as
``processing_class``): GRPO, RLOO, online DPO and distillation on the Qwen2.5-VL and LLaVA-Next stand-ins
(steadyrl.toy.vision),
on 1 and 2 processes. A run SIGKILLed after a mid-rollout checkpoint resumes to the byte-identical result, on the same
number of processes; on another number it trains the same steps within float rounding."""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import MULTI_CPU, TWO_PROCESSES, assert_close_weights, read_logs, run_toy
from safetensors.torch import load_file
from support.toy_run import make_trainer, vision_task

CASES = {
    "grpo-qwen2_5_vl": ("grpo", "qwen2_5_vl"),
    "rloo-llava_next": ("rloo", "llava_next"),
    "grpo-qwen2_5_vl-lora": ("grpo", "qwen2_5_vl", "--lora"),  # adapters on the language model, the tower frozen
    "distillation-qwen2_5_vl": ("distillation", "qwen2_5_vl"),  # the teacher's pass reads the images too
    "online-dpo-llava_next": ("online-dpo", "llava_next"),
    "grpo-tools": ("grpo", "tools"),  # a tool's replies hold images: each sample's own, in its completion
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(case, processes)``: an uninterrupted run of a case, made once per module."""
    made = {}

    def get(case: str, processes: int = 1) -> Path:
        if (case, processes) not in made:
            out = tmp_path_factory.mktemp(f"vision-{case}-{processes}")
            run_toy(out, *flags(case), *launch(processes)[0], accelerate_config=launch(processes)[1])
            made[case, processes] = out
        return made[case, processes]

    return get


def flags(case: str) -> list[str]:
    algorithm, family, *extra = CASES[case]
    return ["--algorithm", algorithm, "--vision", family, *extra]


def launch(processes: int) -> tuple[list[str], Path | None]:
    return (TWO_PROCESSES, MULTI_CPU) if processes == 2 else ([], None)


def assert_identical(reference: Path, resumed: Path, after_step: int) -> None:
    part = next(
        name
        for name in ("model.safetensors", "adapter_model.safetensors")
        if (reference / "final-actor" / name).is_file()
    )
    assert (resumed / "final-actor" / part).read_bytes() == (reference / "final-actor" / part).read_bytes()
    ref, new = read_logs(reference), read_logs(resumed)
    assert sorted(new) == sorted(ref) == list(range(1, 13))
    for step in range(after_step + 1, 13):
        for key in set(ref[step]) - {"tokens_per_second"}:
            assert new[step][key] == ref[step][key], f"step {step}: {key} differs"


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigkill_after_a_mid_rollout_checkpoint_resumes_identically(runs, tmp_path, case):
    reference = runs(case)
    run_toy(tmp_path, *flags(case), "--kill-after-save", "6", expect_kill=True)
    if "lora" in case:
        adapters = load_file(runs(case) / "final-actor" / "adapter_model.safetensors")
        assert adapters and all("language_model" in name for name in adapters), "the vision tower has no adapters"
    buffer = load_file(tmp_path / "checkpoint-6" / "rollout_buffer_0.safetensors")
    assert any(".pixel_values" in name for name in buffer), "the mid-rollout buffer stores the images' tensors"
    _, output = run_toy(tmp_path, *flags(case), "--resume")
    assert "checkpoint-6" in output
    assert_identical(reference, tmp_path, after_step=6)
    signal = "divergence" if case.startswith("distillation") else "reward"
    values = [entry[signal] for entry in read_logs(reference).values()]
    assert len(set(values)) > 1, f"the {signal} must depend on the completions for the run to test anything"


def test_two_processes_train_as_one_resume_identically_and_resume_on_one(runs, tmp_path):
    case = "grpo-qwen2_5_vl"
    one, two = runs(case, 1), runs(case, 2)
    assert_close_weights(two, one)  # the same global batch on 2 processes: the same training, up to rounding
    flags2, config = launch(2)
    run_toy(tmp_path, *flags(case), *flags2, "--kill-after-save", "6", accelerate_config=config, expect_kill=True)
    assert (tmp_path / "checkpoint-6" / "rollout_buffer_1.safetensors").is_file()
    on_one = tmp_path.parent / f"{tmp_path.name}-on-one"
    shutil.copytree(tmp_path, on_one)
    run_toy(tmp_path, *flags(case), *flags2, "--resume", accelerate_config=config)
    assert_identical(two, tmp_path, after_step=6)
    run_toy(on_one, *flags(case), *flags2, "--resume")  # 2 -> 1 process: the same steps, reduced in another order
    assert_close_weights(on_one, two)
    ours, theirs = read_logs(on_one), read_logs(two)
    for step in range(7, 13):
        assert ours[step]["reward"] == pytest.approx(theirs[step]["reward"], rel=1e-6), step


def test_online_dpo_trains_on_pairs_of_completions_of_one_image_and_evaluates_held_out_images(tmp_path):
    from steadyrl.toy.vision import colour_dataset

    task = {**vision_task("qwen2_5_vl"), "eval_dataset": colour_dataset(4, seed=1), "per_device_eval_batch_size": 4}
    trainer = make_trainer(tmp_path, algorithm="online-dpo", max_steps=2, save_steps=100, **task)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert any(name.startswith("model.visual") for name in moved), "the vision tower trains"
    assert any("language_model" in name for name in moved)
    assert all(torch.isfinite(torch.tensor(entry["loss"])) for entry in trainer.state.log_history if "loss" in entry)
    metrics = trainer.evaluate()
    assert metrics["eval_completions/mean_length"] > 0 and "eval_rewards/colour_letters_reward/mean" in metrics


def test_evaluation_loss_hf_generate_never_samples_an_image_token_and_the_actor_is_published_with_its_processor(
    tmp_path,
):
    from transformers import AutoModelForImageTextToText

    from steadyrl.toy.vision import colour_dataset

    task = {**vision_task("qwen2_5_vl"), "eval_dataset": colour_dataset(4, seed=1), "per_device_eval_batch_size": 4}
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=1, save_steps=100, **task)
    assert torch.isfinite(torch.tensor(trainer.evaluate()["eval_loss"]))  # GRPO's loss of held-out images
    image_token = trainer.processor.image_token_id
    with torch.no_grad():  # make the image token the likeliest next token everywhere
        trainer.model.lm_head.weight[image_token] = 50 * trainer.model.lm_head.weight.abs().max()
    sampled = trainer.rollout_source.next(trainer.state)
    completions = [token for row in sampled.generation.completion_ids for token in row]
    assert image_token in trainer.backend.suppressed and image_token not in completions
    trainer.save_model(str(tmp_path / "actor"))
    assert (tmp_path / "actor" / "processor_config.json").is_file()
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "actor")
    assert type(loaded) is type(trainer.model)


def test_prompts_with_images_are_kept_whole_unless_max_prompt_length_is_set(tmp_path):
    import random

    from datasets import Dataset

    from steadyrl.toy.vision import square_image

    rng = random.Random(0)  # two images per prompt, placed where the messages say (TRL's multi-image rows)
    rows = {
        "prompt": [
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "or"}, {"type": "image"}]}]
        ]
        * 4,
        "images": [[square_image("red", rng), square_image("blue", rng)] for _ in range(4)],
        "colour": ["red"] * 4,
    }
    task = {**vision_task("qwen2_5_vl"), "train_dataset": Dataset.from_dict(rows)}
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=1, save_steps=100, **task)
    sampled = trainer.rollout_source.next(trainer.state)
    assert len(sampled.prompt_ids[0]) > 16 and sampled.generation.images.counts["image_grid_thw"][0] == 2
    trainer.args.max_prompt_length, trainer.args._prompt_length_given = 16, True  # as if the user had set it
    with pytest.raises(ValueError, match="more than max_prompt_length=16"):
        trainer.rollout_source.next(trainer.state)


@pytest.mark.parametrize(
    "algorithm, family", [("grpo", "llava_next"), ("rloo", "qwen2_5_vl"), ("distillation", "llava_next")]
)
def test_each_algorithm_trains_the_other_family_too(tmp_path, algorithm, family):
    """With the SIGKILL cases above and online DPO's test, each algorithm trains both stand-ins. The reward is the
    completion's length, which differs within a group from the first step: the colour reward is 0 for every sample of
    a random LLaVA-Next's first rollout, whose gradient is then rounding noise (0 or not, by the CPU)."""
    task = vision_task(family, algorithm)
    if "reward_funcs" in task:
        task["reward_funcs"] = [lambda completions, **kwargs: [len(c[-1]["content"]) / 8.0 for c in completions]]
    trainer = make_trainer(tmp_path, algorithm=algorithm, max_steps=2, save_steps=100, **task)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert trainer.state.log_history[0]["grad_norm"] > 1e-3, "a gradient of the task, not of rounding noise"
    tower = "model.visual" if family == "qwen2_5_vl" else "model.vision_tower"
    assert any(name.startswith(tower) for name in moved), "the vision tower trains"
    assert any("language_model" in name for name in moved)
    assert all(torch.isfinite(torch.tensor(entry["loss"])) for entry in trainer.state.log_history if "loss" in entry)


def test_ddp_finds_the_vision_towers_unused_parameters_unless_told_otherwise(tmp_path):
    """LLaVA-Next's CLIP tower has a post_layernorm the language model never reads: under DDP with gradient
    checkpointing (transformers then turns the search off) RLOO failed on 2 processes with 'parameters that did not
    receive grad'. Non-reentrant checkpointing takes the search; the user's setting wins."""
    task = vision_task("llava_next", "rloo")
    trainer = make_trainer(tmp_path / "default", algorithm="rloo", **task)
    assert trainer.args.gradient_checkpointing and trainer.accelerator.ddp_handler.find_unused_parameters
    told = make_trainer(tmp_path / "told", algorithm="rloo", ddp_find_unused_parameters=False, **task)
    assert not told.accelerator.ddp_handler.find_unused_parameters
