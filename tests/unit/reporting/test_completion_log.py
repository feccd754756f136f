"""CompletionLog: completions.jsonl, its truncation at resume, the printed table, and the real TensorBoard and wandb
integrations (offline)."""

import glob
import json
import os
import signal
import sys

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from steadyrl.data.prompts import UserTurns
from steadyrl.reporting.completion_log import COMPLETIONS_FILE, CompletionLog, markdown_table, rows_to_print, visible
from steadyrl.toy.chat import CHAT_TEMPLATE, build_chat_tokenizer


def make_rows(n: int, tag: str = "") -> list[dict]:
    return [
        {
            "prompt": f"prompt{i}{tag}",
            "completion": f"completion{i}{tag}",
            "rewards": {"letters": i / 4, "length": -0.5},
            "reward": i / 4 - 0.5,
            "advantage": i - 1.5,
        }
        for i in range(n)
    ]


def read_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_jsonl_holds_one_object_per_row_with_its_step(tmp_path):
    log = CompletionLog(tmp_path / "out")
    log.write(1, make_rows(2))
    rows = make_rows(3, "b")
    rows[0]["advantage"], rows[1]["completion"] = None, 'multi\nline "quoted" ünï'
    log.write(2, rows)
    lines = read_lines(tmp_path / "out" / COMPLETIONS_FILE)
    assert [line["step"] for line in lines] == [1, 1, 2, 2, 2]
    assert lines[0] == {
        "step": 1,
        "prompt": "prompt0",
        "completion": "completion0",
        "reward": -0.5,
        "rewards": {"letters": 0.0, "length": -0.5},
        "advantage": -1.5,
    }
    assert lines[2]["advantage"] is None and lines[3]["completion"] == 'multi\nline "quoted" ünï'
    assert all(isinstance(line["reward"], float) for line in lines)


def test_numpy_and_torch_numbers_become_json_floats(tmp_path):
    import numpy as np
    import torch

    log = CompletionLog(tmp_path)
    row = {
        "prompt": "p",
        "completion": "c",
        "rewards": {"r": np.float32(0.5)},
        "reward": torch.tensor(0.5),
        "advantage": float("nan"),
    }
    log.write(3, [row])
    assert read_lines(log.path) == [
        {"step": 3, "prompt": "p", "completion": "c", "reward": 0.5, "rewards": {"r": 0.5}, "advantage": None}
    ]


def test_a_write_survives_a_kill_right_after(tmp_path):
    log = CompletionLog(tmp_path)
    pid = os.fork()
    if pid == 0:  # the child writes, then is killed before Python could flush anything at exit
        log.write(4, make_rows(3))
        os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    assert [line["completion"] for line in read_lines(log.path)] == ["completion0", "completion1", "completion2"]


def test_truncate_after_makes_a_resumed_run_write_what_an_uninterrupted_one_does(tmp_path):
    uninterrupted = CompletionLog(tmp_path / "uninterrupted")
    for step in (1, 2, 3, 4):
        uninterrupted.write(step, make_rows(2, f"s{step}"))

    resumed = CompletionLog(tmp_path / "resumed")
    for step in (1, 2, 3):
        resumed.write(step, make_rows(2, f"s{step}"))
    with open(resumed.path, "ab") as f:  # killed in the middle of step 4's write, inside a UTF-8 character
        f.write(json.dumps({"step": 4, "prompt": "ü"}, ensure_ascii=False).encode()[:-5])
    resumed.truncate_after(2)  # the last checkpoint was checkpoint-2
    assert [line["step"] for line in read_lines(resumed.path)] == [1, 1, 2, 2]
    assert not list(resumed.path.parent.glob("*.tmp"))
    for step in (3, 4):
        resumed.write(step, make_rows(2, f"s{step}"))
    assert resumed.path.read_bytes() == uninterrupted.path.read_bytes()


def test_truncate_after_drops_only_a_partial_last_line_at_the_checkpoint_step(tmp_path):
    log = CompletionLog(tmp_path)
    log.write(2, make_rows(2))
    complete = log.path.read_bytes()
    with open(log.path, "ab") as f:
        f.write(b'{"step": 2, "prompt": "cut sh')
    log.truncate_after(2)
    assert log.path.read_bytes() == complete


def test_truncate_after_leaves_a_clean_file_untouched_and_a_fresh_start_empties_it(tmp_path):
    log = CompletionLog(tmp_path)
    log.truncate_after(0)  # no file yet: nothing to do
    assert not log.path.exists()
    log.write(5, make_rows(2))
    before = os.stat(log.path)
    log.truncate_after(5)
    after = os.stat(log.path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    log.truncate_after(0)
    assert log.path.read_bytes() == b""


def test_rows_to_print_takes_the_first_ones():
    rows = make_rows(5)
    assert rows_to_print(rows, 2) == rows[:2]
    assert rows_to_print(rows, None) == rows
    assert rows_to_print(rows, 0) == []
    assert rows_to_print(rows, 9) == rows
    with pytest.raises(ValueError, match="num_to_print=-1"):
        CompletionLog("out", num_to_print=-1)


def test_visible_shows_newlines_and_keeps_start_and_end():
    assert visible("a\nb\tc") == "a\\nb\\tc"
    shortened = visible("start " + "x" * 500 + " end", max_chars=40)
    assert len(shortened) == 40 and shortened.startswith("start ") and shortened.endswith(" end") and "…" in shortened


@pytest.mark.parametrize("rich_installed", [True, False])
def test_printed_table_shows_prompt_completion_rewards_and_advantage(tmp_path, capsys, monkeypatch, rich_installed):
    if not rich_installed:
        for name in ("rich", "rich.console", "rich.table", "rich.text"):
            monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    monkeypatch.setenv("COLUMNS", "160")  # rich's width where the output is not a terminal (80 without it)
    rows = make_rows(4)
    rows[1]["completion"] = "[bold]ab\ncd[/bold]"  # not rich markup, and its newline shows
    CompletionLog(tmp_path, num_to_print=2).write(7, rows)
    out = capsys.readouterr().out
    assert "Completions at step 7" in out
    for text in (
        "prompt0",
        "completion0",
        "prompt1",
        "[bold]ab\\ncd[/bold]",
        "letters",
        "length",
        "advantage",
        "0.25",
        "-0.25",
        "-1.5",
        "-0.5",
    ):
        assert text in out, text
    assert "prompt2" not in out and "completion3" not in out  # num_to_print=2
    assert len(read_lines(tmp_path / COMPLETIONS_FILE)) == 4  # the file has every row


# SmolLM2-Instruct's template: a default system message when the conversation has none
DEFAULT_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant with a long default system message<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SYSTEM = "You are a careful tutor. " * 8


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, DEFAULT_SYSTEM_TEMPLATE], ids=["chatml", "default-system"])
@pytest.mark.parametrize("system", [True, False], ids=["system", "no-system"])
def test_printed_prompt_is_the_last_user_turn_of_a_conversation(tmp_path, capsys, monkeypatch, template, system):
    monkeypatch.setenv("COLUMNS", "200")
    tokenizer = build_chat_tokenizer()
    tokenizer.chat_template = template
    conversation = [{"role": "system", "content": SYSTEM}] if system else []
    conversation += [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, ask away."},
        {"role": "user", "content": "Which letters are in qwer?"},
    ]
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=True)
    rows = make_rows(1)
    rows[0]["prompt"] = tokenizer.decode(ids["input_ids"])  # as the completion log holds it: what the model saw
    CompletionLog(tmp_path, user_turns=UserTurns.of(tokenizer)).write(1, rows)
    out = capsys.readouterr().out
    assert "Which letters are in qwer?" in out
    assert not any(text in out for text in ("careful tutor", "default system", "Hello, ask away", "im_start")), out
    assert read_lines(tmp_path / COMPLETIONS_FILE)[0]["prompt"] == rows[0]["prompt"], "the file keeps it whole"


def test_printed_prompt_is_the_end_of_a_long_text_prompt(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    rows = make_rows(1)
    rows[0]["prompt"] = "Context: " + "lorem ipsum " * 30 + "Question: which letters are in qwer?"
    CompletionLog(tmp_path).write(1, rows)
    out = capsys.readouterr().out
    assert "…" in out and "Question: which letters are in qwer?" in out and "Context:" not in out


def test_the_table_starts_on_a_line_of_its_own_under_a_progress_bar(tmp_path, capsys):
    from tqdm.auto import tqdm

    bar = tqdm(total=4, desc="steadyrl", file=sys.stdout)  # as the training bar, on the same terminal
    bar.update(1)
    CompletionLog(tmp_path).write(1, make_rows(1))
    bar.close()
    out = capsys.readouterr().out
    line = out[: out.index("Completions at step 1")].replace("\r", "\n").splitlines()[-1]
    assert "steadyrl" not in line, "the bar is cleared before the table"
    assert "steadyrl" in out[out.index("Completions at step 1") :], "and drawn again after it"


def test_a_template_that_cannot_render_the_probes_gives_no_user_turns():
    tokenizer = build_chat_tokenizer()
    tokenizer.chat_template = "{{ raise_exception('system first') }}"
    assert UserTurns.of(tokenizer) is None


def test_no_integration_set_up_means_print_and_file_only(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[dev]')")
    from transformers.integrations import TensorBoardCallback

    not_set_up = TensorBoardCallback()  # its writer is made at on_train_begin, which has not run
    CompletionLog(tmp_path).write(1, make_rows(1), [PrinterCallback(), not_set_up])
    assert not_set_up.tb_writer is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [COMPLETIONS_FILE]
    assert "completion0" in capsys.readouterr().out


def test_markdown_table_escapes_what_markdown_and_html_would_swallow():
    row = {
        "prompt": "a|b",
        "completion": "<script>x</script> **y** _z_\nnext",
        "rewards": {"r": 1.0},
        "reward": 1.0,
        "advantage": None,
    }
    lines = markdown_table([row]).splitlines()
    assert lines[0] == "| prompt | completion | rewards/r | reward |"
    assert lines[2] == r"| a\|b | &lt;script&gt;x&lt;/script&gt; \*\*y\*\* \_z\_<br>next | 1 | 1 |"


def test_tensorboard_gets_a_markdown_table(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[dev]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugin_util import markdown_to_safe_html
    from tensorboard.util.tensor_util import make_ndarray
    from transformers.integrations import TensorBoardCallback

    args = TrainingArguments(output_dir=str(tmp_path), report_to=["tensorboard"])
    state, control = TrainerState(), TrainerControl()
    callback = TensorBoardCallback()
    callback.on_train_begin(args, state, control)  # as Trainer does: the writer goes to output_dir/runs/<time>
    rows = make_rows(3)
    rows[2]["completion"] = "<b>not bold</b>\nsecond line"
    CompletionLog(tmp_path, num_to_print=1).write(6, rows, [callback])
    callback.on_train_end(args, state, control)

    events = EventAccumulator(callback.logging_dir)
    events.Reload()
    [event] = events.Tensors("completions/text_summary")
    assert event.step == 6
    text = make_ndarray(event.tensor_proto).item().decode()
    assert text == markdown_table(rows)
    rendered = markdown_to_safe_html(text)  # what TensorBoard's text tab shows
    assert rendered.count("<tr>") == 4  # the header and every row, not only the printed one
    assert "&lt;b&gt;not bold&lt;/b&gt;<br>second line" in rendered and "completion1" in rendered


def offline_wandb(tmp_path, monkeypatch):
    """An offline wandb run begun as Trainer begins it; its callback."""
    import wandb  # noqa: F401 - skipped above where it is not installed
    from transformers.integrations import WandbCallback

    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_PROJECT": "steadyrl-test",
        "WANDB_CONSOLE": "off",
        "WANDB_SILENT": "true",
    }.items():
        monkeypatch.setenv(name, value)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=["wandb"])
    callback = WandbCallback()
    callback.on_train_begin(args, TrainerState(), TrainerControl())  # as Trainer does: wandb.init, offline
    return callback


def test_wandb_offline_run_gets_a_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[dev]')")
    import wandb

    callback = offline_wandb(tmp_path, monkeypatch)
    try:
        run_dir = wandb.run.dir
        rows = make_rows(2)
        rows[1]["advantage"] = None
        CompletionLog(tmp_path / "out").write(9, rows, [callback])
    finally:
        wandb.finish()
    [table_file] = glob.glob(os.path.join(run_dir, "media", "table", "completions_*.table.json"))
    with open(table_file) as f:
        saved = json.load(f)
    assert saved["columns"] == [
        "step",
        "prompt",
        "completion",
        "rewards/letters",
        "rewards/length",
        "reward",
        "advantage",
    ]
    assert saved["data"] == [
        [9, "prompt0", "completion0", 0.0, -0.5, -0.5, -1.5],
        [9, "prompt1", "completion1", 0.25, -0.5, -0.25, None],
    ]


def test_log_multimodal_puts_each_rows_images_in_the_wandb_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[dev]')")
    import wandb
    from PIL import Image

    callback = offline_wandb(tmp_path, monkeypatch)
    try:
        run_dir = wandb.run.dir
        rows = make_rows(2)
        rows[0]["images"], rows[1]["images"] = [Image.new("RGB", (8, 8), (255, 0, 0))], []
        CompletionLog(tmp_path / "out").write(3, rows, [callback])
    finally:
        wandb.finish()
    [table_file] = glob.glob(os.path.join(run_dir, "media", "table", "completions_*.table.json"))
    saved = json.loads(open(table_file).read())
    assert saved["columns"][-1] == "image"
    # a cell holds a wandb.Image, which an offline run's table file names by its type (the file is synced later)
    assert saved["data"][0][-1] == "Image" and saved["data"][1][-1] is None
    assert "images" not in read_lines(tmp_path / "out" / COMPLETIONS_FILE)[0]  # completions.jsonl stays text


def test_wandb_callback_without_a_run_is_left_alone(tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[dev]')")
    import wandb
    from transformers.integrations import WandbCallback

    assert wandb.run is None
    CompletionLog(tmp_path).write(1, make_rows(1), [WandbCallback()])
    assert wandb.run is None and len(read_lines(tmp_path / COMPLETIONS_FILE)) == 1


def test_log_unique_prompts_keeps_each_prompts_first_row_in_the_tensorboard_table(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[dev]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray
    from transformers.integrations import TensorBoardCallback

    args = TrainingArguments(output_dir=str(tmp_path), report_to=["tensorboard"])
    state, control = TrainerState(), TrainerControl()
    callback = TensorBoardCallback()
    callback.on_train_begin(args, state, control)
    rows = [dict(row, prompt=f"prompt{i // 2}") for i, row in enumerate(make_rows(4))]  # 2 prompts x 2 samples
    CompletionLog(tmp_path, unique_prompts=True).write(3, rows, [callback])
    callback.on_train_end(args, state, control)

    events = EventAccumulator(callback.logging_dir)
    events.Reload()
    [event] = events.Tensors("completions/text_summary")
    assert make_ndarray(event.tensor_proto).item().decode() == markdown_table([rows[0], rows[2]])  # TRL's table
    assert len(read_lines(tmp_path / COMPLETIONS_FILE)) == 4  # the file keeps every row, as TRL's parquet files
    printed = capsys.readouterr().out
    assert "completion1" in printed and "completion3" in printed  # and the printed table, as TRL's rich print
