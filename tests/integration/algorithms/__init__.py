"""Each algorithm in runs: GRPO, RLOO, PPO, online DPO, reference syncing, PEFT, what they learn."""
