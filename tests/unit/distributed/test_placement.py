"""Where the frozen models go (distributed/placement.py), with stand-ins that record their moves."""

from __future__ import annotations

import pytest

from steadyrl.distributed import placement


class Frozen:
    """A model or scorer stand-in: records where it was moved."""

    def __init__(self, offload: bool = False) -> None:
        self.moves, self.offload, self.device = [], offload, None
        self.model = self

    def to(self, device):
        self.moves.append(str(device))
        return self


def test_without_zero3_the_reference_sits_on_the_device_unless_offloaded():
    ref, scorers = Frozen(), [Frozen(), Frozen()]
    assert placement.place_frozen_models(ref, scorers, "cuda:1", None, offload=False) is ref
    assert ref.moves == ["cuda:1"] and all(scorer.moves == ["cuda:1"] for scorer in scorers)
    offloaded_ref = Frozen()
    placement.place_frozen_models(offloaded_ref, [], "cuda:1", None, offload=True)
    assert offloaded_ref.moves == [], "an offloaded reference stays in CPU memory until it is used"
    assert placement.place_frozen_models(None, [], "cuda:1", None, offload=False) is None


def test_under_zero3_each_frozen_model_becomes_an_inference_engine(monkeypatch):
    engines = []

    def inference_engine(model, config, offload):
        engines.append((model, config, offload))
        return f"engine-{len(engines)}"

    monkeypatch.setattr(placement, "inference_engine", inference_engine)
    ref, scorer = Frozen(), Frozen(offload=True)
    config = {"zero_optimization": {"stage": 3}}
    assert placement.place_frozen_models(ref, [scorer], "cuda:0", config, offload=False) == "engine-1"
    assert engines == [(ref, config, False), (scorer, config, True)], "each scorer offloads as it asked"
    assert (scorer.model, scorer.offload, scorer.device) == ("engine-2", False, "cuda:0"), "the engine offloads"
    assert ref.moves == [] and scorer.moves == [], "nothing is moved whole"


@pytest.mark.parametrize("offload", [True, False])
def test_offloaded_moves_to_the_device_for_the_block_and_back_even_after_an_error(offload):
    model = Frozen()
    with placement.offloaded(model, "cuda:0", offload) as inside:
        assert inside is model
    with pytest.raises(RuntimeError), placement.offloaded(model, "cuda:0", offload):
        raise RuntimeError("the forward pass failed")
    assert model.moves == (["cuda:0", "cpu"] * 2 if offload else [])
