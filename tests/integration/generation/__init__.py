"""Generation backends: HF generate, colocated vLLM, the vLLM server, its key, rollouts generated ahead."""
