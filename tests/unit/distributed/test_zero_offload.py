"""Resuming DeepSpeedCPUAdam (the optimizer of ZeRO offload) continues bit for bit, which needs its C++
bias-correction state rebuilt: ``steadyrl.distributed.zero.replay_cpu_adam_steps``."""

import copy

import torch

from steadyrl.distributed.zero import replay_cpu_adam_steps


def adam(param):
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam([param], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)


def train(param, optimizer, grads):
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()


def test_a_restored_cpu_adam_continues_exactly_like_the_uninterrupted_one(tmp_path):
    torch.manual_seed(0)
    start = torch.nn.Parameter(torch.randn(4096))
    grads = [torch.randn(4096) for _ in range(24)]
    # float32 beta2^t as a running product and as pow(beta2, t) first differ at t = 3, 6, 19: resume at 18
    uninterrupted = copy.deepcopy(start)
    train(uninterrupted, adam(uninterrupted), grads)

    first = copy.deepcopy(start)
    optimizer = adam(first)
    train(first, optimizer, grads[:18])
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")

    results = {}
    for replay in (True, False):
        resumed = torch.nn.Parameter(first.detach().clone())
        restored = adam(resumed)
        restored.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
        if replay:
            replay_cpu_adam_steps(restored)
        train(resumed, restored, grads[18:])
        results[replay] = resumed.detach()
    assert torch.equal(results[True], uninterrupted.detach())
    # without the replay the bias corrections differ in their last bits: the replay is still needed
    assert not torch.equal(results[False], uninterrupted.detach())
