"""The real pretrained chat model (SmolLM2-135M-Instruct, steadyrl.real): its fixture, the trainers on it, runs."""
