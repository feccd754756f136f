"""The learner alone, built from its inputs (a config, an Accelerator, an algorithm, a tiny module), no trainer: one
step is the mean of the micro-batches' gradients applied once, between the algorithm's begin_step and end_step, with
Trainer's events in Trainer's order; a non-finite loss moves no weight and is reported to the algorithm."""

import math
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from steadyrl.checkpoint.checkpointer import TrainedModule
from steadyrl.rollout import Advantages, Rollout
from steadyrl.trainers.loop.algorithm import Algorithm, Processes
from steadyrl.trainers.loop.learner import Learner

N, C = 4, 3  # samples in the mini-batch, completion tokens


class Regression(Algorithm):
    """A loss that reads the batch's scores: the squared error of a linear model of the completion ids."""

    def __init__(self, args, processes, poison: bool = False):
        super().__init__(args, processes, eos_token_id=None)
        self.poison, self.calls = poison, []

    def advantages(self, rollout):
        return Advantages()

    def begin_step(self, global_step):
        self.calls.append(("begin_step", global_step))

    def loss(self, model, batch):
        prediction = model(batch.completion_ids.float()).squeeze(1)  # [B]
        loss = ((prediction - batch.scores) ** 2).mean()
        return loss * math.nan if self.poison else loss, {"prediction": prediction.mean().item()}

    def end_step(self, refused):
        self.calls.append(("end_step", dict(refused)))
        return {"end_step_metric": 1.0}


def settings(**changes):
    values = dict(
        micro_train_batch_size=2,
        max_grad_norm=None,
        pad_to_multiple_of=None,
        logging_nan_inf_filter=True,
        max_consecutive_nonfinite_steps=3,
        steps_per_rollout=1,
        mask_truncated_completions=False,
    )
    return SimpleNamespace(**{**values, **changes})


def minibatch() -> Rollout:
    generator = torch.Generator().manual_seed(0)
    return Rollout(
        prompt_ids=torch.ones(N, 2, dtype=torch.long),
        prompt_mask=torch.ones(N, 2, dtype=torch.long),
        completion_ids=torch.randint(0, 5, (N, C), generator=generator),
        completion_mask=torch.ones(N, C, dtype=torch.long),
        scores=torch.randn(N, generator=generator),
    )


def actor() -> TrainedModule:
    torch.manual_seed(0)
    model = torch.nn.Linear(C, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return TrainedModule("actor", model, optimizer, scheduler, model, save=lambda directory: None)


def learn(algorithm_settings: dict | None = None, **changes):
    args = settings(**changes)
    accelerator = Accelerator(cpu=True)
    algorithm = Regression(args, Processes(accelerator), **(algorithm_settings or {}))
    learner = Learner(args, accelerator, algorithm, pad_token_id=0, deepspeed=False)
    module, events = actor(), []
    before = {name: p.detach().clone() for name, p in module.model.named_parameters()}
    metrics = learner.step(minibatch(), [module], global_step=7, fire=events.append)
    return module, before, metrics, events, algorithm, learner


def test_one_step_applies_the_mean_gradient_of_its_micro_batches_once():
    module, before, metrics, events, algorithm, _ = learn()
    reference = actor().model
    batch = minibatch()
    prediction = reference(batch.completion_ids.float()).squeeze(1)
    halves = [((prediction[i : i + 2] - batch.scores[i : i + 2]) ** 2).mean() for i in (0, 2)]
    (sum(halves) / 2).backward()  # the mean over the 2 micro-batches of their means
    for name, param in reference.named_parameters():
        torch.testing.assert_close(module.model.get_parameter(name), before[name] - 0.1 * param.grad)
    assert events == ["on_substep_end", "on_pre_optimizer_step", "on_optimizer_step"]
    assert algorithm.calls == [("begin_step", 7), ("end_step", {})]
    assert metrics["loss"] == pytest.approx(sum(h.item() for h in halves) / 2)
    assert metrics["end_step_metric"] == 1.0 and metrics["learning_rate"] == 0.1


def test_a_nonfinite_loss_moves_no_weight_and_is_reported_to_the_algorithm():
    module, before, metrics, events, algorithm, learner = learn({"poison": True})
    for name, param in module.model.named_parameters():
        assert torch.equal(param, before[name])
    assert algorithm.calls[-1] == ("end_step", {"actor": "loss nan"})
    assert "loss" not in metrics  # logging_nan_inf_filter: as Trainer, a NaN loss is not logged
    assert learner.guard.total == 1 and events[-1] == "on_optimizer_step"
