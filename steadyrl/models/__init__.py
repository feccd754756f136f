"""The models of a run: loading, scalar heads (reward models, the critic), PEFT helpers."""
