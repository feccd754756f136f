"""Every trainer's ``__init__`` shows TRL's parameters, in TRL's order, to anything that reads the signature
(``help()``, IDEs, ``inspect``): positional calls written for TRL land on the same parameters. steadyrl's own
parameters come after TRL's (``tools`` for RLOO, the keyword-only ``reward_model``, ``judge``, ...)."""

import importlib
import inspect

import pytest

from steadyrl import ALGORITHMS

# steadyrl's name -> TRL 1.16's trainer of the same algorithm (PPO and REINFORCE++ have none: TRL dropped PPO, and
# REINFORCE++ is OpenRLHF's; they take RLOO's arguments, the on-policy trainers' shared order)
TRL_TRAINERS = {
    "grpo": ("trl", "GRPOTrainer"),
    "rloo": ("trl", "RLOOTrainer"),
    "ppo": ("trl", "RLOOTrainer"),
    "reinforce-pp": ("trl", "RLOOTrainer"),
    "online-dpo": ("trl.experimental.online_dpo", "OnlineDPOTrainer"),
    "distillation": ("trl", "DistillationTrainer"),
    "gkd": ("trl.experimental.gkd", "GKDTrainer"),
}


def parameters(cls) -> list[inspect.Parameter]:
    return list(inspect.signature(cls.__init__).parameters.values())[1:]  # without self


def test_every_registered_trainer_is_compared_with_trl():
    assert set(TRL_TRAINERS) == set(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(TRL_TRAINERS))
def test_the_signature_lists_trls_parameters_in_trls_order(name):
    module, class_name = TRL_TRAINERS[name]
    theirs = [p.name for p in parameters(getattr(importlib.import_module(module), class_name))]
    ours = parameters(ALGORITHMS[name].trainer_class)
    assert not [p for p in ours if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)], "hidden behind *args / **kwargs"
    assert [p.name for p in ours[: len(theirs)]] == theirs
    positional = [p.name for p in ours if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional[: len(theirs)] == theirs, "TRL's parameters can be passed by position, as in TRL"
