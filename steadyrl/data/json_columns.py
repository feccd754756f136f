"""Dataset columns that a checkpoint stores as JSON (``max_staleness``: the rollouts generated ahead keep their rows'
columns, which the reward functions receive as keyword arguments, as TRL passes them). A value must come back from
JSON as the same value of the same type, or a resumed run's reward functions would see something else than the
uninterrupted run's: strings, ints, floats, bools, None, and lists and string-keyed dicts of those. Images (PIL, as
``datasets`` decodes an ``Image`` feature) are stored as their pixels, a tensor (``to_state`` / ``from_state``). A
datetime or bytes is refused before any work, a tuple too (it would come back as a list)."""

from __future__ import annotations

from typing import Any

from .stream import first_rows, is_stream

JSON_SCALARS = (str, int, float, bool, type(None))


IMAGE = "__pil_image__"


def is_image(value: Any) -> bool:
    from PIL import Image

    return isinstance(value, Image.Image)


def json_exact(value: Any) -> bool:
    """Whether ``value`` comes back from ``from_state(json(to_state(value)))`` equal and of the same type."""
    if type(value) in JSON_SCALARS or is_image(value):
        return True
    if type(value) is list:
        return all(json_exact(item) for item in value)
    if type(value) is dict:
        return all(type(key) is str and json_exact(item) for key, item in value.items())
    return False


def check_json_columns(rows: dict[str, list], staleness: int) -> None:
    """Refuse a column of ``rows`` (column -> values) with a value JSON does not keep exactly, naming it and its
    type."""
    for name, values in rows.items():
        for value in values:
            if not json_exact(value):
                raise ValueError(
                    f"max_staleness={staleness} stores the rollouts generated ahead, with their dataset columns, in "
                    f"each checkpoint as JSON, and column {name!r} holds a {type(value).__name__} ({value!r:.60}), "
                    "which JSON does not keep exactly (the reward functions would see something else after a "
                    "resume): convert the column to str, int, float, bool or None (or lists and dicts of them), "
                    "remove it (dataset.remove_columns, or remove_unused_columns=True), or use max_staleness=0."
                )


def check_ahead_columns(dataset, args, stream_rows: int = 8) -> None:
    """Before any work: the columns besides ``prompt`` that ``max_staleness`` would store (a map-style dataset's
    first row, a stream's first ``stream_rows``; each rollout's rows are checked again as they are drawn)."""
    if not args.max_staleness or args.remove_unused_columns or dataset is None:
        return
    if is_stream(dataset):
        rows = first_rows(dataset, stream_rows)
    elif len(dataset):
        rows = [dataset[0]]
    else:
        return
    columns = {name: [row[name] for row in rows] for name in rows[0] if name != "prompt"} if rows else {}
    check_json_columns(columns, args.max_staleness)


def to_state(value: Any) -> Any:
    """``value`` with each image replaced by its raw bytes (a uint8 tensor, for a checkpoint's safetensors file), its
    mode, size and palette; ``from_state`` gives it back equal, pixel for pixel."""
    if is_image(value):
        import torch

        raw = torch.frombuffer(bytearray(value.tobytes()), dtype=torch.uint8)
        return {IMAGE: raw, "mode": value.mode, "size": list(value.size), "palette": value.getpalette()}
    if type(value) is list:
        return [to_state(item) for item in value]
    if type(value) is dict:
        return {key: to_state(item) for key, item in value.items()}
    return value


def from_state(value: Any) -> Any:
    """``to_state``'s inverse."""
    if type(value) is dict and IMAGE in value:
        from PIL import Image

        image = Image.frombytes(value["mode"], tuple(value["size"]), value[IMAGE].numpy().tobytes())
        if value["palette"] is not None:
            image.putpalette(value["palette"])
        return image
    if type(value) is list:
        return [from_state(item) for item in value]
    if type(value) is dict:
        return {key: from_state(item) for key, item in value.items()}
    return value
