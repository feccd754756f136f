"""Several processes under ``accelerate launch`` (gloo on CPU): DDP, DeepSpeed ZeRO, FSDP2, several machines."""
