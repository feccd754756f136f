"""Multi-turn rollouts (tools, environment_factory, rollout_func) in whole runs."""
