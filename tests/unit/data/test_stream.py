"""The streaming prompt sampler (steadyrl/data/stream.py) alone: its state is JSON and resumes at the exact row,
shuffled streams included, a shuffled stream is reshuffled each epoch, and the rows it draws are checked. Streams in
training runs (SIGKILL resume, several processes): tests/integration/data/test_streaming.py."""

import json

import pytest
from datasets import Dataset, IterableDataset

from steadyrl.data.stream import StreamSampler


def numbers(count: int, shards: int = 2) -> IterableDataset:
    return Dataset.from_dict({"prompt": [f"p{i}:" for i in range(count)]}).to_iterable_dataset(num_shards=shards)


def drawn(sampler: StreamSampler, count: int) -> list[str]:
    return [row["prompt"] for row in sampler.next(count)]


def test_sampler_state_is_json_and_resumes_at_the_exact_row():
    sampler = StreamSampler(numbers(5))
    drawn(sampler, 7)  # into the second epoch
    state = json.loads(json.dumps(sampler.state_dict()))
    restored = StreamSampler(numbers(5))
    restored.load_state_dict(state)
    assert (restored.epoch_index, restored.rows_in_epoch, restored.consumed) == (1, 2, 7)
    assert drawn(restored, 6) == drawn(sampler, 6) == ["p2:", "p3:", "p4:", "p0:", "p1:", "p2:"]


def generated_numbers():
    yield from ({"prompt": f"p{i}:"} for i in range(16))


@pytest.mark.parametrize("kind", ["arrow", "generator"])
@pytest.mark.parametrize("drawn_before", [2, 13, 21])  # in the first buffer, past its first refill, in epoch 1
def test_shuffled_stream_resumes_at_the_exact_row(kind, drawn_before):
    def shuffled():  # datasets restores a shuffle buffer empty: the sampler reads the epoch again instead
        stream = numbers(16, shards=4) if kind == "arrow" else IterableDataset.from_generator(generated_numbers)
        return stream.shuffle(seed=0, buffer_size=8)

    sampler = StreamSampler(shuffled())
    drawn(sampler, drawn_before)
    restored = StreamSampler(shuffled())
    restored.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert drawn(restored, 20) == drawn(sampler, 20)


def test_sampler_reshuffles_a_shuffled_stream_each_epoch():
    sampler = StreamSampler(numbers(16, shards=4).shuffle(seed=0, buffer_size=4))
    first, second = drawn(sampler, 16), drawn(sampler, 16)
    assert sorted(first) == sorted(second) and first != second
    assert sampler.epoch == 2.0


def no_rows():
    yield from ()


def test_sampler_checks_the_rows_it_draws():
    rows = Dataset.from_dict({"prompt": ["a:", "", "c:"]}).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"train_dataset's row 1 of epoch 0: its prompt is an empty string"):
        drawn(StreamSampler(rows), 3)
    with pytest.raises(ValueError, match="yielded no rows in epoch 0"):
        drawn(StreamSampler(IterableDataset.from_generator(no_rows)), 1)
