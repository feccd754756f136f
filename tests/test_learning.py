"""On the toy task, RLOO clearly raises the reward of held-out prompts in a short run."""

from steadyrl import RLOOConfig, RLOOTrainer
from steadyrl.demo import mean_reward
from steadyrl.toy import COMPLETION_LENGTH, letters_reward, toy_dataset, toy_model_path


def test_rloo_raises_held_out_reward(tmp_path):
    args = RLOOConfig(
        output_dir=str(tmp_path),
        rollout_batch_size=16,
        n_samples_per_prompt=4,
        micro_rollout_batch_size=32,
        train_batch_size=64,
        micro_train_batch_size=32,
        max_completion_length=COMPLETION_LENGTH,
        learning_rate=5e-4,
        lr_scheduler_type="constant",
        beta=0.01,
        max_steps=40,
        save_steps=1000,
        seed=0,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = RLOOTrainer(model=toy_model_path(), args=args, train_dataset=toy_dataset(), reward_funcs=[letters_reward])
    held_out = toy_dataset(num_prompts=128, seed=1)
    before = mean_reward(trainer.model, trainer.processing_class, held_out)
    trainer.train()
    after = mean_reward(trainer.model, trainer.processing_class, held_out)
    assert after > before + 0.2, f"mean held-out reward {before:.3f} -> {after:.3f}"
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.2
