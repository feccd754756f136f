"""Models with a scalar head: reward models and the PPO critic.

Both are ``AutoModelForSequenceClassification`` models with ``num_labels=1`` (a causal-LM backbone and
a ``score`` linear layer), read on the policy's own token ids, so their vocabulary must be the policy's.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from .ops import joined_inputs, pad_prompts_and_completions
from .placement import offloaded
from .zero import check_whole, whole_at_load


def load_scalar_model(model: str | PreTrainedModel, role: str) -> PreTrainedModel:
    """Load ``model`` (a path or a loaded model) as a one-output sequence classifier; ``role`` names it in errors."""
    if isinstance(model, str):
        with whole_at_load():
            model = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1)
    check_whole(model, role)
    head = getattr(model, "score", None)
    if not isinstance(head, torch.nn.Linear) or not hasattr(model, "base_model_prefix"):
        raise ValueError(
            f"{role} must be an AutoModelForSequenceClassification with a linear `score` head; "
            f"got {type(model).__name__}."
        )
    if head.out_features != 1:
        raise ValueError(f"{role} has num_labels={head.out_features}; a reward or value model needs num_labels=1.")
    hidden = model.config.get_text_config().hidden_size
    if head.in_features != hidden:
        raise ValueError(
            f"{role}'s score head expects hidden size {head.in_features}, but its backbone has "
            f"hidden_size={hidden}: the head belongs to another model."
        )
    return model


def check_same_vocabulary(model: PreTrainedModel, role: str, policy: PreTrainedModel, tokenizer, own_tokenizer=None):
    """Refuse a scalar model that would read the policy's token ids as other tokens."""
    policy_vocab = policy.config.get_text_config().vocab_size
    vocab = model.config.get_text_config().vocab_size
    if vocab != policy_vocab:
        raise ValueError(
            f"{role} has vocab_size={vocab} but the policy has vocab_size={policy_vocab}: it scores the policy's "
            "token ids, so it must share the policy's tokenizer."
        )
    if own_tokenizer is not None and own_tokenizer.get_vocab() != tokenizer.get_vocab():
        differing = sorted(set(own_tokenizer.get_vocab().items()) ^ set(tokenizer.get_vocab().items()))[:3]
        raise ValueError(
            f"{role}'s tokenizer does not match the policy's (processing_class): e.g. {differing}. "
            "Use a reward model trained with the policy's tokenizer."
        )


def token_scores(model: PreTrainedModel, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """The scalar head applied at every position of prompt + completion: [B, P + C], float32."""
    backbone = getattr(model, model.base_model_prefix)
    inputs = joined_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    hidden = backbone(**inputs, use_cache=False).last_hidden_state
    return model.score(hidden).squeeze(-1).float()


def sequence_scores(model: PreTrainedModel, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """One score [B] per sequence, read at its last token (the last prompt token if the completion is empty)."""
    scores = token_scores(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    last = prompt_ids.shape[1] - 1 + completion_mask.sum(1)
    return scores.gather(1, last.unsqueeze(1)).squeeze(1)


class Critic(torch.nn.Module):
    """The value model: V(s_t) for each completion token t, the value of the state just before it.

    A module of its own (not a function of the classifier) so that DDP / DeepSpeed wrap its forward.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    @property
    def config(self):
        return self.model.config

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:  # -> [B, C]
        scores = token_scores(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask)
        return scores[:, prompt_ids.shape[1] - 1 : -1]

    def save_pretrained(self, directory, **kwargs) -> None:
        self.model.save_pretrained(directory, **kwargs)


def critic_from_policy(policy: PreTrainedModel, seed: int) -> PreTrainedModel:
    """A sequence classifier with the policy's backbone weights and a freshly (seeded) initialised score head."""
    if hasattr(policy, "get_base_model"):  # PEFT: the critic starts from the base model's weights
        policy = policy.get_base_model()
    settings = {k: v for k, v in policy.config.to_dict().items() if k not in ("id2label", "label2id")}
    config = policy.config.__class__.from_dict({**settings, "num_labels": 1})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        with whole_at_load():
            critic = AutoModelForSequenceClassification.from_config(config)
    backbone = getattr(critic, critic.base_model_prefix)
    expected = backbone.state_dict().keys()
    # Under PEFT the wrapped layers hold the base weights as `<layer>.base_layer.*`, next to the adapter's tensors.
    source = getattr(policy, policy.base_model_prefix).state_dict()
    source = {key.replace(".base_layer.", "."): value for key, value in source.items()}
    backbone.load_state_dict({key: value for key, value in source.items() if key in expected})
    return critic.to(policy.dtype)


class RewardModelFunction:
    """A reward model as a reward function with TRL's calling convention (``prompts``, ``completion_ids``).

    Prompts are tokenized with the policy's tokenizer exactly as the trainer does, so the model scores
    the very token ids that were generated. With ``offload`` the model waits in CPU memory and visits
    ``device`` only while it scores.
    """

    __name__ = "reward_model"

    def __init__(self, model, tokenizer, max_prompt_length: int, batch_size: int, offload: bool = False) -> None:
        self.model = model.eval().requires_grad_(False)
        self.tokenizer, self.max_prompt_length, self.batch_size = tokenizer, max_prompt_length, batch_size
        self.offload = offload
        self.device = torch.device("cpu")

    def to(self, device) -> RewardModelFunction:
        self.device = torch.device(device)
        if not self.offload:
            self.model.to(self.device)
        return self

    @torch.no_grad()
    def __call__(self, prompts: list[str], completion_ids: list[list[int]], **kwargs) -> list[float]:
        prompt_ids = [ids[-self.max_prompt_length :] for ids in self.tokenizer(prompts)["input_ids"]]
        scores = []
        with offloaded(self.model, self.device, self.offload):
            for i in range(0, len(prompt_ids), self.batch_size):
                batch = pad_prompts_and_completions(
                    prompt_ids[i : i + self.batch_size],
                    completion_ids[i : i + self.batch_size],
                    self.tokenizer.pad_token_id,
                    self.device,
                )
                scores += sequence_scores(self.model, *batch.values()).tolist()
        return scores
