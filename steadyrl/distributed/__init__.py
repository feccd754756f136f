"""How models are spread over processes and devices: DeepSpeed ZeRO, FSDP2, frozen-model placement."""
