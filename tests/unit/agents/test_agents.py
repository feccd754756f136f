"""The multi-turn pieces on their own: tool calls run as TRL runs them (failures answered, not raised), and the
turn loop's bookkeeping on token ids (env_mask, log-probs, the completion budget, max_tool_calling_iterations)."""

import asyncio

import pytest

from steadyrl.agents.chat_format import tool_suffix_ids
from steadyrl.agents.environments import Environments
from steadyrl.agents.tools import ToolBox, run_tool_calls
from steadyrl.agents.turn_images import ToolReply
from steadyrl.agents.turns import run_turns
from steadyrl.generation import Generation
from steadyrl.toy.tools import tool_tokenizer


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: a.
        b: b.
    """
    return a + b


async def slow_double(x: int) -> int:
    """Double, later.

    Args:
        x: x.
    """
    await asyncio.sleep(0.01)
    return 2 * x


def broken(x: int) -> int:
    """Raise.

    Args:
        x: x.
    """
    raise RuntimeError("no luck")


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_calls_answer_in_call_order_and_failures_become_errors():
    box = ToolBox([add, slow_double, broken])
    results = run_tool_calls(
        [
            call("slow_double", x=4),
            call("add", a=1, b=2),
            call("broken", x=1),
            call("nope"),
            call("add", a=1),
            {"type": "code", "name": "x"},
        ],
        box,
    )
    contents = [message["content"] for message in results.messages]
    assert [m["name"] for m in results.messages] == ["slow_double", "add", "broken", "nope", "add", "x"]
    assert contents[:2] == ["8", "3"]
    assert contents[2] == "{'error': 'no luck'}" and contents[3] == "{'error': 'Tool nope not found.'}"
    assert "missing 1 required positional argument" in contents[4] and "Unsupported tool call type" in contents[5]
    assert results.failures == 4


# Token ids of a pretend chat: 9 ends a turn; a turn "calls" when it contains 7. The tool's reply is [50, 51].
REPLY = [50, 51]


def parse(row, ids, before):
    return {"role": "assistant", "content": "", **({"tool_calls": [call("add", a=1, b=1)]} if 7 in ids else {})}


def scripted(turns: dict[int, list[list[int]]]):
    """A generate that answers turn t of each row with the next of its scripted turns, log-prob -0.5 per token."""

    def generate(contexts, rows, turn):
        ids = [turns[row][turn] for row in rows]
        return Generation(ids, [[-0.5] * len(i) for i in ids])

    return generate


def test_the_turn_loop_appends_replies_masks_them_and_keeps_the_sampled_ids():
    turns = {0: [[1, 7, 9], [2, 7, 9], [3, 9]], 1: [[4, 9]]}  # row 0 calls twice, row 1 never
    first = Generation([turns[0][0], turns[1][0]], [[-0.5] * 3, [-0.5] * 2])
    out = run_turns(
        scripted(turns),
        parse,
        lambda messages: ToolReply(REPLY),
        [[100], [101]],
        first,
        [ToolBox([add])] * 2,
        max_completion_length=64,
        max_iterations=None,
        context_length=512,
    )
    assert out.completion_ids[0] == [1, 7, 9, 50, 51, 2, 7, 9, 50, 51, 3, 9]
    assert out.env_mask[0] == [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert out.logprobs[0] == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert out.completion_ids[1] == [4, 9] and out.env_mask[1] == [1, 1]
    assert [m["role"] for m in out.completions[0]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert out.metrics["tools/call_frequency"] == 1.0 and out.metrics["turns_per_rollout"] == 2.0


def test_the_budget_and_the_iteration_limit_end_a_trajectory():
    turns = {0: [[1, 7, 9], [2, 2, 2, 2, 7, 9], [3, 9]]}
    first = Generation([turns[0][0]], None)
    common = dict(prompt_ids=[[100]], first=first, boxes=[ToolBox([add])], context_length=512)
    reply = lambda m: ToolReply(REPLY)  # noqa: E731
    # 3 sampled + 2 reply leaves 3 of the 6 sampled ids of turn 2; no room for the second reply
    out = run_turns(scripted(turns), parse, reply, max_completion_length=8, max_iterations=None, **common)
    assert out.completion_ids[0] == [1, 7, 9, 50, 51, 2, 2, 2] and out.logprobs is None
    out = run_turns(scripted(turns), parse, reply, max_completion_length=64, max_iterations=1, **common)
    assert out.completion_ids[0] == [1, 7, 9, 50, 51, 2, 2, 2, 2, 7, 9], "one round of tool calls only"
    out = run_turns(scripted(turns), parse, reply, max_completion_length=4, max_iterations=None, **common)
    assert out.completion_ids[0] == [1, 7, 9] and out.completions[0][-1]["tool_calls"], "no room: the call stands"


class Game:
    def reset(self, **row):
        return None

    def move(self, square: int) -> str:
        """Move.

        Args:
            square: where.
        """
        return "ok"

    async def get_reward(self) -> float:
        return 1.0


class Quiz(Game):
    def get_reward(self) -> float:
        return 0.5


def test_environments_are_one_per_row_and_score_only_their_own_rows():
    environments = Environments({"game": Game, "quiz": Quiz}, tools=[add])
    names = environments.names_for({"environment": ["game", "quiz", "game"]}, 3)
    chosen = environments.instances(names)
    assert len({id(e) for e in chosen}) == 3 and [type(e) for e in chosen] == [Game, Quiz, Game]
    assert [t.__name__ for t in environments.tool_boxes(chosen)[1].tools] == ["add", "move"]
    game_reward, quiz_reward = environments.reward_functions()
    assert asyncio.run(game_reward(environments=chosen)) == [1.0, None, 1.0]
    assert quiz_reward(environments=chosen) == [None, 0.5, None] and quiz_reward.__name__ == "Quiz"


def test_a_template_trl_has_a_training_version_of_is_swapped_for_it_and_the_tokenizer_keeps_its_own():
    """TRL's Qwen3 template drops the empty reasoning block of an assistant turn once a tool reply follows it, so the
    ids of a tool conversation would not be the concatenation of its turns; as TRL's GRPOTrainer does, rollouts are
    rendered with TRL's training version, and the tool replies' ids then follow the model's turn exactly."""
    from pathlib import Path

    import trl
    from transformers import AutoTokenizer

    from steadyrl.agents.chat_format import check_append_only, tool_suffix_ids, training_template_kwargs
    from steadyrl.real import smollm2_path

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    qwen3 = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer.chat_template = qwen3
    reply = [{"role": "tool", "name": "add", "content": "5"}]
    with pytest.raises(ValueError, match="a tool reply after an assistant turn without text re-renders that turn"):
        check_append_only(tokenizer, [add], {})
    with pytest.raises(ValueError, match="renders an assistant turn differently once a tool reply follows it"):
        tool_suffix_ids(tokenizer, reply, {})
    kwargs = training_template_kwargs(tokenizer, [add], {})
    assert set(kwargs) == {"chat_template"} and kwargs["chat_template"] != qwen3
    assert tokenizer.chat_template == qwen3, "the tokenizer saved with the model keeps its template"
    suffix = tokenizer.decode(tool_suffix_ids(tokenizer, reply, kwargs))
    assert suffix == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def huge(x: int) -> int:
    """An int past Python's int-to-str digit limit.

    Args:
        x: x.
    """
    return 10**5000


def pair(x: int) -> list:
    """A list, which a text chat template cannot render.

    Args:
        x: x.
    """
    return [1, 2]


def test_a_result_that_cannot_be_made_text_or_rendered_is_a_failed_call_not_a_crash():
    # the same seeds give the same result after a resume: raising here would stop the run at this step for good
    tok = tool_tokenizer()
    turns = {0: [[1, 7, 9], [3, 9]]}

    def calls(row, ids, before):
        made = [call("huge", x=1), call("pair", x=1), call("add", a=1, b=2)] if 7 in ids else []
        return {"role": "assistant", "content": "", **({"tool_calls": made} if made else {})}

    out = run_turns(
        scripted(turns),
        calls,
        lambda messages: ToolReply(tool_suffix_ids(tok, messages, {})),
        [[100]],
        Generation([turns[0][0]], None),
        [ToolBox([add, huge, pair])],
        max_completion_length=512,
        max_iterations=None,
        context_length=4096,
    )
    replies = [m["content"] for m in out.completions[0] if m["role"] == "tool"]
    assert replies[0].startswith("{'error': 'its result cannot be made text: Exceeds the limit")
    assert replies[1].startswith("{'error': 'the chat template cannot render its result (TypeError")
    assert replies[2] == "3", "the turn's other calls are answered"
    assert out.metrics["tools/failure_frequency"] == 2 / 3 and out.completion_ids[0][-2:] == [3, 9]
    assert tok.decode(out.completion_ids[0]).count("{'error'") == 2, "the model reads the errors"
