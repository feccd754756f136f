"""TRL's image columns in prompts: placed as TRL places them, rendered once per prompt by the processor."""

import pytest

from steadyrl.data.images import encode_prompts, has_images, prompt_images, prompts_with_images, with_images
from steadyrl.toy.vision import build_processor, colour_dataset


def test_images_go_before_the_first_user_messages_text_as_trl_places_them():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What colour?"}]
    placed = with_images(messages, ["IMG1", "IMG2"])
    assert placed[0]["content"] == [{"type": "text", "text": "Be brief."}]
    assert placed[1]["content"] == [
        {"type": "image", "image": "IMG1"},
        {"type": "image", "image": "IMG2"},
        {"type": "text", "text": "What colour?"},
    ]
    assert messages[1]["content"] == "What colour?"  # the dataset's row is not changed
    assert prompt_images(placed) == ["IMG1", "IMG2"] and has_images([placed])


def test_a_string_prompt_with_an_image_column_is_refused_naming_the_column():
    with pytest.raises(ValueError, match="'image' column, so its prompts must be conversations"):
        prompts_with_images(["What colour?"], ["IMG"], "image")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_next"])
def test_each_prompt_is_rendered_with_its_image_tokens_and_its_own_image_inputs(family):
    processor, rows = build_processor(family), colour_dataset(2)
    prompts = prompts_with_images(rows["prompt"], rows["image"], "image")
    repeated = [prompts[0], prompts[0], prompts[1]]  # a group's samples share their prompt object
    ids, inputs = encode_prompts(repeated, processor, None)
    image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    assert ids[0] == ids[1] and ids[0].count(image_token) > 1  # expanded to the image's feature count
    assert inputs[0] is inputs[1]  # rendered once for the group
    assert "pixel_values" in inputs[0]
    if family == "qwen2_5_vl":
        assert inputs[0]["mm_token_type_ids"].shape == (len(ids[0]),)  # one per prompt token
        assert int(inputs[0]["image_grid_thw"].prod()) == len(inputs[0]["pixel_values"])


def test_image_placeholders_in_the_messages_are_filled_in_order_as_trl_does():
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]},
    ]
    placed = with_images(messages, ["A", "B"])
    assert prompt_images(placed) == ["A", "B"] and placed[0]["content"][1] == {"type": "text", "text": "and"}
    with pytest.raises(ValueError, match="2 image placeholder"):
        with_images(messages, ["A"])
    assert not has_images([with_images([{"role": "user", "content": "no image"}], [])])


def test_content_blocks_are_valid_prompts_and_unknown_blocks_are_refused():
    from steadyrl.data.prompts import check_prompt

    check_prompt([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}], "row 0")
    with pytest.raises(ValueError, match="content blocks of types \\['audio'\\]"):
        check_prompt([{"role": "user", "content": [{"type": "audio"}]}], "row 0")
