"""TRL's call order and names on each trainer: positional arguments as TRL's trainers take them, reward models
inside ``reward_funcs`` with ``reward_processing_classes``, a given ``ref_model``, TRL's old PPO names, and clear
errors for the old order and for TRL parameters steadyrl does not take."""

import pytest
import torch
from support.toy_run import make_config
from transformers import AutoModelForCausalLM

from steadyrl import GRPOTrainer, OnlineDPOTrainer, PPOConfig, PPOTrainer, RLOOTrainer
from steadyrl.models.scalar_head import RewardModelFunction
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path, toy_reward_model_path


@pytest.mark.parametrize(
    ("trainer_class", "algorithm"), [(RLOOTrainer, "rloo"), (GRPOTrainer, "grpo"), (PPOTrainer, "ppo")]
)
def test_trl_positional_order(tmp_path, trainer_class, algorithm):
    """(model, reward_funcs, args, train_dataset, eval_dataset, processing_class): as trl.RLOOTrainer /
    trl.GRPOTrainer take them (PPO: the same order, its critic and reward model by keyword)."""
    eval_dataset = toy_dataset(num_prompts=4, seed=1)
    args = make_config(tmp_path, algorithm)
    trainer = trainer_class(toy_model_path(), [letters_reward], args, toy_dataset(), eval_dataset)
    assert trainer.reward_funcs == [letters_reward] and trainer.args is args
    assert trainer.eval_dataset is eval_dataset and len(trainer.train_dataset) == len(toy_dataset())


def test_online_dpo_takes_trls_order_with_ref_model_second(tmp_path):
    reference = AutoModelForCausalLM.from_pretrained(toy_model_path())
    with torch.no_grad():
        reference.lm_head.weight.mul_(0.5)  # a reference that is not a copy of the policy
    args = make_config(tmp_path, "online-dpo")
    trainer = OnlineDPOTrainer(toy_model_path(), reference, [letters_reward], args, None, toy_dataset(num_prompts=8))
    assert trainer.ref_model is reference and not trainer.ref_model.training
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    assert not torch.equal(trainer.model.lm_head.weight, reference.lm_head.weight)


def test_reward_models_inside_reward_funcs_with_their_tokenizers(tmp_path):
    """TRL reads a path (or model) in reward_funcs as a reward model, scored in its place; reward_weights follow
    reward_funcs' order."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_reward_model_path())
    args = make_config(tmp_path, reward_weights=[0.5, 2.0])
    trainer = RLOOTrainer(
        toy_model_path(),
        [toy_reward_model_path(), letters_reward],
        args,
        toy_dataset(),
        reward_processing_classes=[tokenizer, None],
    )
    assert isinstance(trainer.reward_funcs[0], RewardModelFunction) and trainer.reward_funcs[1] is letters_reward
    assert trainer.reward_model is trainer.reward_funcs[0].model
    assert trainer.reward_weights.tolist() == [0.5, 2.0]
    # TRL's attributes that scripts and callbacks read: the tokenizers aligned with reward_funcs, and the MoE flag
    assert trainer.reward_processing_classes == [tokenizer, None]
    assert trainer.aux_loss_enabled is False


def test_reward_processing_classes_when_none_given(tmp_path):
    """A reward model given without a tokenizer: the one it reads with (here the policy's, which it shares)."""
    trainer = GRPOTrainer(
        toy_model_path(), [letters_reward, toy_reward_model_path()], make_config(tmp_path, "grpo"), toy_dataset()
    )
    assert trainer.reward_processing_classes == [None, trainer.processing_class]


def test_given_ref_model_replaces_the_copy_in_ppo(tmp_path):
    reference = AutoModelForCausalLM.from_pretrained(toy_model_path())
    trainer = PPOTrainer(
        toy_model_path(), [letters_reward], make_config(tmp_path, "ppo"), toy_dataset(), ref_model=reference
    )
    assert trainer.ref_model is reference


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda tmp: RLOOTrainer(toy_model_path(), make_config(tmp), toy_dataset()),
            TypeError,
            "RLOOTrainer takes TRL's order (model, reward_funcs, args, train_dataset",
        ),
        (
            lambda tmp: OnlineDPOTrainer(toy_model_path(), make_config(tmp, "online-dpo")),
            TypeError,
            "OnlineDPOTrainer takes TRL's order (model, ref_model, reward_funcs, args",
        ),
        (
            lambda tmp: RLOOTrainer(
                toy_model_path(),
                [letters_reward],
                make_config(tmp),
                toy_dataset(),
                quantization_config={"load_in_4bit": True},
            ),
            ValueError,
            "RLOOTrainer(quantization_config=...) is not supported",
        ),
        (
            lambda tmp: OnlineDPOTrainer(
                toy_model_path(),
                None,
                [letters_reward],
                make_config(tmp, "online-dpo"),
                data_collator=lambda rows: rows,
            ),
            ValueError,
            "OnlineDPOTrainer(data_collator=...) is not supported: steadyrl pads prompts and completions itself",
        ),
        (
            lambda tmp: GRPOTrainer(
                toy_model_path(),
                [letters_reward],
                make_config(tmp, "grpo", beta=0.0),
                toy_dataset(),
                ref_model=toy_model_path(),
            ),
            ValueError,
            "ref_model was given, but with beta=0.0 GRPOTrainer has no KL term",
        ),
        (
            lambda tmp: RLOOTrainer(
                toy_model_path(),
                [letters_reward],
                make_config(tmp),
                toy_dataset(),
                reward_processing_classes=[None, None],
            ),
            ValueError,
            "reward_processing_classes has 2 entries but reward_funcs has 1",
        ),
    ],
    ids=["old-order", "dpo-old-order", "quantization", "data-collator", "ref-model-beta-0", "processing-classes"],
)
def test_misplaced_or_unused_arguments_are_refused(tmp_path, call, error, message):
    with pytest.raises(error) as raised:
        call(tmp_path)
    assert message in str(raised.value)


def test_trls_old_ppo_names_map_or_say_what_to_use(tmp_path):
    config = PPOConfig(output_dir=str(tmp_path), kl_coef=0.2, response_length=24)
    assert (config.beta, config.max_completion_length) == (0.2, 24)
    with pytest.raises(ValueError, match=r"^kl_coef=0.2 contradicts beta=0.1"):
        PPOConfig(output_dir=str(tmp_path), kl_coef=0.2, beta=0.1)
    with pytest.raises(ValueError, match=r"^num_mini_batches=4 is TRL's old PPO setting.*Set train_batch_size"):
        PPOConfig(output_dir=str(tmp_path), num_mini_batches=4)
    with pytest.raises(ValueError, match=r"^whiten_rewards=True is TRL's old PPO setting.*normalize_reward=True"):
        PPOConfig(output_dir=str(tmp_path), whiten_rewards=True)
    assert PPOConfig(output_dir=str(tmp_path), vf_coef=0.2, cliprange=0.1).cliprange == 0.1  # the same names
