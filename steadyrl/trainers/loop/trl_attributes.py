"""TRL's public trainer attributes that scripts and callbacks read (``trainer.use_vllm``, ``trainer.tools``, ...),
derived from steadyrl's own state so they cannot disagree with what the run does."""

from __future__ import annotations

from transformers import GenerationConfig

from ...rewards import reward_func_name


class TRLAttributesMixin:
    """Read-only views, for ``OnPolicyTrainer``, of what TRL's trainers expose as attributes."""

    @property
    def use_vllm(self) -> bool:
        return bool(self.args.use_vllm)

    @property
    def aux_loss_enabled(self) -> bool:
        """TRL's flag: the loss adds a Mixture-of-Experts model's load-balancing loss (GRPO, RLOO)."""
        policy_loss = getattr(getattr(self, "algorithm", None), "policy_loss", None)
        return bool(policy_loss is not None and policy_loss.aux_loss_enabled)

    @property
    def router_aux_loss_coef(self) -> float:
        """TRL's attribute: the load-balancing loss's weight (0.0 where the loss adds none)."""
        policy_loss = getattr(getattr(self, "algorithm", None), "policy_loss", None)
        return 0.0 if policy_loss is None else policy_loss.router_aux_loss_coef

    @property
    def reward_func_names(self) -> list[str]:
        """Each reward's name, in order, as its metrics are logged (``rewards/<name>/mean``)."""
        return [reward_func_name(func) for func in self.reward_funcs]

    @property
    def tools(self) -> list:
        """The standalone tools, then each environment's methods (every environment of a dict factory), once each."""
        multi_turn = getattr(self, "multi_turn", None)
        if multi_turn is None:
            return []
        tools, environments = list(multi_turn.tools), multi_turn.environments
        for name in environments.factories if environments is not None else ():
            tools += [t for t in environments.tools_of(name) if t.__name__ not in {u.__name__ for u in tools}]
        return tools

    @property
    def environments(self) -> list:
        """The environment instances of the rows last rolled out on this process, in row order ([] without
        ``environment_factory``)."""
        multi_turn = getattr(self, "multi_turn", None)
        return [] if multi_turn is None or multi_turn.environments is None else multi_turn.environments.current

    @property
    def generation_config(self) -> GenerationConfig | None:
        """The ``GenerationConfig`` transformers' generate samples rollouts with; None where vLLM generates."""
        config = getattr(getattr(self, "backend", None), "generation_config", None)
        return config() if callable(config) else None
