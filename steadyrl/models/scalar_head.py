"""Models with a scalar head: reward models and the PPO critic.

Both are ``AutoModelForSequenceClassification`` models with ``num_labels=1`` (a causal-LM backbone and
a ``score`` linear layer), read on the policy's own token ids, so their vocabulary must be the policy's.
"""

from __future__ import annotations

import functools

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedModel
from transformers.utils import logging

from ..distributed.fsdp import is_sharded
from ..distributed.placement import offloaded
from ..distributed.sharded_loading import (
    is_main_process,
    load_split,
    mark_loaded_on_main,
    on_main_only,
    trained_copy_on_main,
    uninitialised,
)
from ..distributed.zero import check_whole, copy_model, copy_weights, gathered, same_kind_of_model
from ..ops import joined_inputs, pad_prompts_and_completions
from ..ops.packing import PackedRows, pack_shared_prompts, packed_hidden_states, packing_fallback

logger = logging.get_logger(__name__)


def load_scalar_model(
    model: str | PreTrainedModel, role: str, init_kwargs: dict | None = None, args=None, frozen: bool = True
) -> PreTrainedModel:
    """Load ``model`` (a path or a loaded model, with ``from_pretrained``'s ``init_kwargs``) as a one-output
    sequence classifier; ``role`` names it in errors. From a path with the run's ``args`` it is split over the
    processes as the run splits a ``frozen`` or trained model (``load_split``)."""
    if isinstance(model, str):
        model = load_split(AutoModelForSequenceClassification, model, init_kwargs or {}, args, frozen, num_labels=1)
    else:
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


def check_same_vocabulary(
    model: PreTrainedModel, role: str, policy: PreTrainedModel, tokenizer, tokenizer_checked: bool = False
):
    """Refuse a model that would read the policy's token ids as other tokens, or has no embedding row for some.

    ``tokenizer_checked``: the model's own tokenizer was found to be the policy's (``same_tokenizer``), so only the
    rows are compared: an embedding padded past the tokenizer (Qwen2.5's reward models have 152,064 rows for
    151,665 tokens) is accepted. Without its tokenizer, a model must have the policy's vocabulary size.
    """
    policy_vocab = policy.config.get_text_config().vocab_size
    vocab = model.config.get_text_config().vocab_size
    if tokenizer_checked:
        if vocab < len(tokenizer):
            raise ValueError(
                f"{role} has vocab_size={vocab}, fewer embedding rows than its tokenizer (the policy's) has tokens "
                f"({len(tokenizer)}): some of the policy's token ids would have no embedding."
            )
        return
    if vocab != policy_vocab:
        hint = (
            " If it has a tokenizer of its own, pass it as reward_processing_class (or save it beside the reward "
            "model, where its path or config._name_or_path points): completions are then re-rendered for it, or "
            "read as they are if it is the policy's."
            if role == "reward_model"
            else ""
        )
        raise ValueError(
            f"{role} has vocab_size={vocab} but the policy has vocab_size={policy_vocab}: it scores the policy's "
            f"token ids, so it must share the policy's tokenizer.{hint}"
        )


def same_tokenizer(tokenizer, other, conversational: bool) -> bool:
    """Whether ``other`` turns text (and, for conversations, messages) into the same token ids as ``tokenizer``."""
    if other is tokenizer:
        return True
    same_template = not conversational or getattr(other, "chat_template", None) == tokenizer.chat_template
    return other.get_vocab() == tokenizer.get_vocab() and same_template


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

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask, packing: bool = False) -> torch.Tensor:
        """[B, C] values; with ``packing`` from one packed pass where the model allows it (ops/packing.py)."""
        tokens = (prompt_ids, prompt_mask, completion_ids, completion_mask)
        if packing and not packing_fallback(self.model, tokens, padded_values, packed_values):
            return packed_values(self.model, pack_shared_prompts(*tokens))
        return padded_values(self.model, *tokens)

    def save_pretrained(self, directory, **kwargs) -> None:
        self.model.save_pretrained(directory, **kwargs)


def padded_values(model: PreTrainedModel, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """[B, C] the scalar head at the position before each completion token (that token's state), float32."""
    scores = token_scores(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    return scores[:, prompt_ids.shape[1] - 1 : -1]


def packed_values(model: PreTrainedModel, packed: PackedRows) -> torch.Tensor:
    """``padded_values`` from one packed pass: [B, C], 0 on padding."""
    hidden = packed_hidden_states(getattr(model, model.base_model_prefix), packed)  # [K, H]
    return packed.scatter(model.score(hidden).squeeze(-1).float())


def critic_from_policy(policy: PreTrainedModel, seed: int) -> PreTrainedModel:
    """A sequence classifier with the policy's backbone weights and a freshly (seeded) initialised score head;
    partitioned like the policy under ZeRO-3, filled one module at a time."""
    if hasattr(policy, "get_base_model"):  # PEFT: the critic starts from the base model's weights
        policy = policy.get_base_model()
    settings = {k: v for k, v in policy.config.to_dict().items() if k not in ("id2label", "label2id")}
    config = policy.config.__class__.from_dict({**settings, "num_labels": 1})
    holds_weights = not on_main_only(policy) or is_main_process()  # FSDP2: the critic too, on the main process
    with torch.random.fork_rng(), same_kind_of_model(policy):  # the run's random stream stays where it was
        create = functools.partial(AutoModelForSequenceClassification.from_config, config, dtype=policy.dtype)
        critic = create() if holds_weights else uninitialised(create)
    if holds_weights:
        backbone = getattr(critic, critic.base_model_prefix)
        # Under PEFT the wrapped layers hold the base weights as `<layer>.base_layer.*`, next to the adapter's.
        copy_weights(
            getattr(policy, policy.base_model_prefix), backbone, lambda name: name.replace(".base_layer.", ".")
        )
    init_score_head(critic, seed)
    if on_main_only(policy):
        mark_loaded_on_main(critic)
    return critic


@torch.no_grad()
def init_score_head(model: PreTrainedModel, seed: int) -> None:
    """The score head drawn from N(0, initializer_range) with ``seed`` (a bias, if any, zero), the same however the
    model was created and partitioned; the run's random stream is left as it was."""
    head = model.score
    with torch.random.fork_rng(), gathered(list(head.parameters()), modify=True):
        torch.manual_seed(seed)
        head.weight.normal_(0.0, getattr(model.config, "initializer_range", 0.02))
        if head.bias is not None:
            head.bias.zero_()


class RewardModelFunction:
    """A reward model (a sequence classifier with one output) scoring a rollout's completions.

    With the policy's tokenizer (``tokenizer=None``) it scores the very token ids the policy saw and sampled. With
    a tokenizer of its own (another vocabulary or chat template, as most off-the-shelf reward models have) it
    scores each prompt + completion re-rendered as text with that tokenizer and its chat template, as TRL does.
    With ``offload`` the model waits in CPU memory and visits ``device`` only while it scores.
    """

    __name__ = "reward_model"

    def __init__(
        self,
        model,
        pad_token_id: int,
        batch_size: int,
        offload: bool = False,
        tokenizer=None,
        chat_template_kwargs: dict | None = None,
    ) -> None:
        self.model = model.eval().requires_grad_(False)
        self.pad_token_id, self.batch_size, self.offload = pad_token_id, batch_size, offload
        self.tokenizer, self.chat_template_kwargs = tokenizer, chat_template_kwargs or {}
        self.device = torch.device("cpu")

    def to(self, device) -> RewardModelFunction:
        self.device = torch.device(device)
        if not self.offload:
            self.model.to(self.device)
        return self

    @torch.no_grad()
    def score_inputs(self, inputs) -> list[float]:
        """One score per completion of ``inputs`` (a ``rewards.RewardInputs``)."""
        n, step, scores = len(inputs.completion_ids), self.batch_size, []
        with offloaded(self.model, self.device, self.offload):
            for i in range(0, n, step):
                if self.tokenizer is None:
                    batch = pad_prompts_and_completions(
                        inputs.prompt_ids[i : i + step],
                        inputs.completion_ids[i : i + step],
                        self.pad_token_id,
                        self.device,
                    )
                    scores += sequence_scores(self.model, *batch.values()).tolist()
                else:
                    scores += self._text_scores(inputs, slice(i, i + step)).tolist()
        return scores

    def _text_scores(self, inputs, rows: slice) -> torch.Tensor:
        texts = []
        for prompt, prompt_text, completion in zip(
            inputs.prompts[rows], inputs.prompt_texts[rows], inputs.completion_texts[rows]
        ):
            if isinstance(prompt, str):
                texts.append(prompt_text + completion)
            else:
                messages = [*prompt, {"role": "assistant", "content": completion}]
                texts.append(self.tokenizer.apply_chat_template(messages, tokenize=False, **self.chat_template_kwargs))
        encoded = self.tokenizer(
            texts, padding=True, padding_side="right", add_special_tokens=False, return_tensors="pt"
        ).to(self.device)
        backbone = getattr(self.model, self.model.base_model_prefix)
        hidden = backbone(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).last_hidden_state
        last = encoded["attention_mask"].sum(1) - 1  # [B] the last real token of each right-padded row
        return self.model.score(hidden).squeeze(-1).float().gather(1, last.unsqueeze(1)).squeeze(1)


def initial_critic(
    value_model, init_kwargs: dict, actor: PreTrainedModel, tokenizer, reward_model, reads_policy_tokens: bool, args
) -> PreTrainedModel:
    """PPO's critic before training: ``value_model`` (a model, path or Hub id), else as in OpenRLHF a copy of the
    reward model where it reads the policy's tokens, else the policy's backbone with a new value head. Under ZeRO-3
    it is created partitioned, as the models it comes from; creating it leaves the run's random stream where it was
    (transformers initialises a model created under zero.Init before loading it). ``init_kwargs``: the
    ``from_pretrained`` arguments of ``value_model``; ``reads_policy_tokens``: the reward model reads the policy's
    token ids (it has no tokenizer of its own)."""
    if value_model is not None:
        with torch.random.fork_rng():
            critic = load_scalar_model(value_model, "value_model", init_kwargs, args, frozen=False)
        check_same_vocabulary(critic, "value_model", actor, tokenizer)
        return critic
    if reward_model is not None and reads_policy_tokens:
        sharded = is_sharded(reward_model)  # FSDP2: the main process holds the critic until it is prepared
        return trained_copy_on_main(reward_model) if sharded else copy_model(reward_model)
    if reward_model is not None:
        logger.warning(
            "The critic starts from the policy's backbone, not from a copy of reward_model: the reward model has a "
            "tokenizer of its own, and the critic reads the policy's token ids."
        )
    return critic_from_policy(actor, args.seed)
