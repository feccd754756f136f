"""HF generate samples from exactly the distribution the config asks for."""

import pytest
from support.toy_run import make_trainer


@pytest.mark.parametrize("top_k, warpers", [(0, []), (5, ["TopKLogitsWarper"])])
def test_top_k_0_means_no_top_k(tmp_path, top_k, warpers):
    # transformers fills an unset top_k with 50, which would truncate a real vocabulary when top_k=0 asks for none
    trainer = make_trainer(tmp_path, top_k=top_k)
    model = trainer.accelerator.unwrap_model(trainer.model)
    config = model._prepare_generation_config(trainer.backend.generation_config())[0]
    processors = model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=1,
        encoder_input_ids=None,
        prefix_allowed_tokens_fn=None,
        logits_processor=None,
    )
    assert [type(p).__name__ for p in processors] == warpers


@pytest.mark.parametrize("cap, calls", [(None, [8]), (3, [3, 3, 2])])
def test_hf_generate_takes_the_whole_rollout_in_one_call_unless_capped(tmp_path, cap, calls):
    """micro_generation_batch_size caps a generate call; the scoring passes keep micro_rollout_batch_size (2 here)."""
    trainer = make_trainer(tmp_path, micro_rollout_batch_size=2, micro_generation_batch_size=cap)
    sizes, generate = [], trainer.model.generate

    def recording(input_ids, **kwargs):
        sizes.append(len(input_ids))
        return generate(input_ids=input_ids, **kwargs)

    trainer.model.generate = recording
    rollout = trainer.make_rollout_buffer().rollout
    assert sizes == calls and len(rollout) == 8  # toy_run: 4 prompts x 2 samples
