"""Which of the config's settings a resumed run may change (``FREE_SETTINGS``), and the config split accordingly into
the settings the run's fingerprint fixes and the free ones (checkpoint/fingerprint.py compares them)."""

from __future__ import annotations

from ...checkpoint.fingerprint import plain_json, redacted_settings
from .trl_names import MAX_NEW_TOKENS, SYNONYMS

# Settings a resumed run may change: they extend the run, or change logging, evaluation, saving, publishing, where
# files go and how processes and devices are set up, never the updates themselves.
FREE_SETTINGS = frozenset(
    {
        "max_steps",
        "num_train_epochs",
        "output_dir",
        "overwrite_output_dir",
        "resume_from_checkpoint",
        "logging_steps",
        "logging_strategy",
        "logging_first_step",
        "logging_nan_inf_filter",
        "log_level",
        "log_level_replica",
        "log_on_each_node",
        "report_to",
        "run_name",
        "project",
        "trackio_space_id",
        "trackio_bucket_id",
        "trackio_static_space_id",
        "disable_tqdm",
        "skip_memory_metrics",
        "include_num_input_tokens_seen",
        "log_completions",
        "num_completions_to_print",
        "log_unique_prompts",
        "log_completions_hub_repo",
        "log_multimodal",
        "save_steps",
        "save_strategy",
        "save_total_limit",
        "save_only_model",
        "save_on_each_node",
        "save_final_checkpoint",
        "stop_on_signal",
        "max_consecutive_nonfinite_steps",
        "restore_callback_states_from_checkpoint",
        "eval_strategy",
        "eval_steps",
        "eval_delay",
        "eval_on_start",
        "eval_accumulation_steps",
        "eval_do_concat_batches",
        "eval_use_gather_object",
        "per_device_eval_batch_size",
        "num_generations_eval",
        "bf16_full_eval",
        "fp16_full_eval",
        "batch_eval_metrics",
        "prediction_loss_only",
        "include_for_metrics",
        "metric_for_best_model",
        "greater_is_better",
        "load_best_model_at_end",
        "do_train",
        "do_eval",
        "do_predict",
        "push_to_hub",
        "hub_model_id",
        "hub_strategy",
        "hub_token",
        "hub_private_repo",
        "hub_always_push",
        "hub_revision",
        "hub_push_merged",
        "dataloader_drop_last",
        "dataloader_in_order",
        "dataloader_multiprocessing_context",
        "dataloader_num_workers",
        "dataloader_persistent_workers",
        "dataloader_pin_memory",
        "dataloader_prefetch_factor",
        "local_rank",
        "use_cpu",
        "deepspeed",
        "accelerator_config",
        "ddp_backend",
        "ddp_timeout",
        "ddp_broadcast_buffers",
        "ddp_bucket_cap_mb",
        "ddp_find_unused_parameters",
        "ddp_static_graph",
        "debug",
        "torch_empty_cache_steps",
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "pad_to_multiple_of",  # masked columns: the same numbers (a saved buffer is re-padded to the new multiple)
        "ref_reward_offload",
        "allow_low_precision_weights",
        "vllm_gpu_memory_utilization",
        "vllm_kv_cache_space",
        "vllm_enable_sleep_mode",
        "vllm_server_base_url",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_server_timeout",
        "vllm_group_port",
        "vllm_server_weight_transfer",
        "vllm_server_weights_dir",
        "max_num_gen_batches",  # dynamic sampling's bound only stops a run (raise it to resume), never changes one
    }
)
# Free settings a checkpoint does not record: where the run happens to be (a checkpoint's content does not depend on
# its directory, so a run directory can be moved) and secrets.
WHERE = frozenset({"output_dir", "run_name", "resume_from_checkpoint", "local_rank", "deepspeed", "hub_token"})
# TRL's names for steadyrl's fields (trl_names.py): they restate a setting the fingerprint holds under its own name.
MIRRORS = frozenset(
    {synonym.trl_name for synonym in (*SYNONYMS, MAX_NEW_TOKENS)}
    | {"kl_coef", "response_length"}  # TRL's old PPO names (ppo.py), views of beta and max_completion_length
    | {"per_device_train_batch_size", "generation_batch_size", "steps_per_generation"}
    # derived from the global batch and the number of processes, which a resume may change (docs/resuming.md)
    | {"gradient_accumulation_steps"}
)


def split_settings(args) -> tuple[dict, dict]:
    """The config's settings as ``(fixed, free)``, each ``{"args.<field>": value}``, without secrets."""
    settings = plain_json(args.to_dict())
    fixed = {f"args.{k}": v for k, v in settings.items() if k not in FREE_SETTINGS | MIRRORS}
    free = {f"args.{k}": v for k, v in settings.items() if k in FREE_SETTINGS - WHERE}
    return redacted_settings(fixed), redacted_settings(free)
