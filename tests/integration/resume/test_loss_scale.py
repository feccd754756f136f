"""The fp16 loss scale resumes where the run left it: restarting at the initial scale would skip, for overflow,
steps the original run took.

fp16 cannot run on this CPU (accelerate turns native AMP off on CPU, and DeepSpeed's CPU accelerator refuses fp16
without MKL-DNN fp16 support), so these tests drive the real save and load paths with what does run here: accelerate's
loss scaler on CPU in the real training loop (float32 weights: scaling by powers of two is exact), and DeepSpeed's
dynamic loss scaler object through the functions that save and restore its numbers.
"""

import io
import shutil
import types

import torch
from support.toy_run import make_trainer

from steadyrl import compat


def scaled_trainer(output_dir, **overrides):
    """A toy RLOO trainer whose accelerator scales the loss as under fp16: from 2**10, doubling after every step
    without overflow (CPU float32 gradients never overflow)."""
    trainer = make_trainer(output_dir, max_steps=4, save_steps=2, **overrides)
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    return trainer


def test_a_resumed_run_continues_from_the_saved_loss_scale(tmp_path):
    uninterrupted = scaled_trainer(tmp_path / "run")
    uninterrupted.train()
    assert uninterrupted.accelerator.scaler.get_scale() == 2.0**14  # 4 steps, each doubling it
    assert torch.load(tmp_path / "run" / "checkpoint-2" / "scaler.pt", weights_only=True)["scale"] == 2.0**12

    shutil.copytree(tmp_path / "run" / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    resumed = scaled_trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.accelerator.scaler.get_scale() == 2.0**14, "the scale restarted at its initial value"
    actor = "checkpoint-4/model.safetensors"
    assert (tmp_path / "resumed" / actor).read_bytes() == (tmp_path / "run" / actor).read_bytes()


def test_deepspeed_loss_scaler_numbers_round_trip_as_plain_values():
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    def zero_with_scaler():
        scaler = DynamicLossScaler(
            init_scale=2.0**16, scale_window=1000, min_scale=1, delayed_shift=2, consecutive_hysteresis=False
        )
        return types.SimpleNamespace(loss_scaler=scaler)

    trained = zero_with_scaler()  # as after 700 iterations, an overflow at 650 halving the scale
    trained.loss_scaler.cur_scale, trained.loss_scaler.cur_iter = 2.0**15, 700
    trained.loss_scaler.last_overflow_iter, trained.loss_scaler.cur_hysteresis = 650, 1
    buffer = io.BytesIO()
    torch.save(compat.loss_scaler_state(trained), buffer)  # as zero_state does, in optimizer_<rank>.pt
    buffer.seek(0)
    restored = zero_with_scaler()
    compat.load_loss_scaler_state(restored, torch.load(buffer, weights_only=True))
    for name in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"):
        assert getattr(restored.loss_scaler, name) == getattr(trained.loss_scaler, name), name
