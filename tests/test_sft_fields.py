"""data=chat beyond role and content: an assistant turn's `reasoning_content` and `tool_calls`, `tool`
messages and a record's `tools` reach the chat template, whose rendering is the model's own
(`tok.apply_chat_template(messages, tools=tools)`, Qwen3's template: tests/qwen3_chat.py), and
data.loss_on trains each assistant turn as the model writes it (its thinking block, content, tool
calls and end-of-turn token); `qwen3exp data show` marks exactly those. A field the template does
not render, and any field or role data=chat does not know, exit 2 before launch naming the file,
the line and the record's key: nothing a user wrote is dropped without a word.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import run_cli
from qwen3_chat import qwen3_tokenizer
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.data.chat.records import BadRecord
from qwen3exp.data.chat.render import load_tokenizer, messages_of, render
from test_sft import runs

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
RECORD = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "The user wants the weather.", "tool_calls": [CALL]},
        {"role": "tool", "content": '{"temp_c": 18}'},
        {"role": "assistant", "reasoning_content": "18 degrees: say so.", "content": "It is 18 C in Paris."},
    ],
    "tools": TOOLS,
}
CALLED = (
    '<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris"}}\n</tool_call><|im_end|>'
)
ANSWER = "<think>\n18 degrees: say so.\n</think>\n\nIt is 18 C in Paris.<|im_end|>"
RESULT = '\n<|im_start|>user\n<tool_response>\n{"temp_c": 18}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory) -> Path:
    return qwen3_tokenizer(tmp_path_factory.mktemp("tok") / "qwen3")


@pytest.mark.parametrize("loss_on", ["assistant", "last_assistant", "all"])
def test_reasoning_tool_calls_and_tools_are_the_templates_own_tokens_trained_as_loss_on_says(qwen3_folder, loss_on):
    tok = load_tokenizer(qwen3_folder)
    r = render(tok, messages_of(json.dumps(RECORD)), loss_on)
    own = tok.apply_chat_template(RECORD["messages"], tools=TOOLS, tokenize=True)["input_ids"]
    assert r.ids == list(own)  # the model's own template, every field rendered
    text = tok.decode(r.ids)
    head = text[: text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")]
    assert "# Tools" in head and '"name": "get_weather"' in head  # the tools, in the system turn
    expected = {
        "assistant": [(False, head), (True, CALLED), (False, RESULT), (True, ANSWER), (False, "\n")],
        "last_assistant": [(False, head + CALLED + RESULT), (True, ANSWER), (False, "\n")],
        "all": [(True, text)],
    }[loss_on]
    assert runs(tok, r.ids, r.trained) == expected


def test_the_ranks_train_the_assistant_turns_reasoning_and_tool_calls(qwen3_folder, tmp_path):
    """The first batch of the ranks' dataloader (rank 0 of 1): labels -100 except the assistant turns
    as `render` marks them, so the thinking blocks and the tool call are trained."""
    from conftest import compose
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.titan.chat_dataset import ChatDataLoader, loader_config  # lazy: imports torchtitan

    data = tmp_path / "tools.jsonl"
    data.write_text(json.dumps(RECORD) + "\n")
    exp = validate_experiment(compose("experiment=tiny_sft", f"data.path={data}", "validation.enable=false"))
    loader = ChatDataLoader(
        loader_config(exp, str(qwen3_folder), validation=False),
        dp_world_size=1,
        dp_rank=0,
        seq_len=512,
        local_batch_size=1,
    )
    _, labels = next(iter(loader))
    tok = load_tokenizer(qwen3_folder)
    assert tok.decode([t for t in labels[0].tolist() if t != -100]) == CALLED + ANSWER


def test_data_show_marks_the_reasoning_and_the_tool_calls(qwen3_folder, tmp_path):
    data = tmp_path / "tools.jsonl"
    data.write_text((json.dumps(RECORD) + "\n") * 2)  # one conversation per data-parallel rank
    args = (
        "experiment=tiny_sft",
        f"data.path={data}",
        f"model.hf_assets_path={qwen3_folder}",
        "validation.enable=false",
    )
    r = run_cli("data", "show", *args, "training.seq_len=512", "-n", "1", f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    sample = r.stdout[r.stdout.index("--- sample 1") :]
    assert re.findall(r"\[\[(.*?)\]\]", sample, re.S) == [CALLED, ANSWER]
    assert "each assistant turn (reasoning, content, tool calls) and its end-of-turn token" in r.stdout


def _bad_records() -> list[dict]:
    user, answer = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}
    older = {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."}
    return [
        {"messages": [user, older, user, answer]},  # Qwen3 keeps no reasoning before the last user turn
        {"messages": [{**user, "name": "Ada"}, answer]},
        {"messages": [user, answer], "id": 7},
        {"messages": [{**user, "tool_calls": [CALL]}, answer]},
        {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": "call_1"}]}]},
        {"messages": [user, {"role": "function", "content": "18"}, answer]},
    ]


EXPECTED = [
    "line 1: messages[1].reasoning_content is not rendered by the chat template, so it would be dropped",
    "line 2: messages[0].name is not a field of a message (role, content, reasoning_content, tool_calls)",
    "line 3: id is not a field of a chat record",
    "line 4: messages[0].tool_calls is on a user message: only an assistant turn has one",
    "line 5: messages[1].tool_calls[0].id is not a field of a tool call (type, function)",
]


def test_fields_not_rendered_or_not_known_exit_2_naming_the_record_and_the_field(qwen3_folder, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in _bad_records()))
    args = (f"data.path={bad}", f"model.hf_assets_path={qwen3_folder}", f"hydra.run.dir={tmp_path / 'run'}")
    r = run_cli("experiment=tiny_sft", "dry_run=true", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    for line in EXPECTED:
        assert f"data.path = '{bad}': bad.jsonl {line}" in r.stderr, r.stderr[-4000:]
    assert "(and 1 more bad record(s))" in r.stderr  # line 6: a role that is not one of system, user, assistant, tool
    with pytest.raises(BadRecord, match="is 'function', not one of system, user, assistant, tool"):
        messages_of(json.dumps(_bad_records()[5]))


def test_the_bundled_template_renders_no_tool_or_reasoning_so_they_are_refused():
    """The bundled tokenizer's template is Qwen3's without tools, tool calls and reasoning: a record
    with them is refused (field by field), never trained without them."""
    tok = load_tokenizer(TOKENIZER_DIR)
    conv = messages_of(json.dumps(RECORD))
    with pytest.raises(BadRecord) as e:
        render(tok, conv)
    assert e.value.key == "messages[2].reasoning_content" and "not rendered by the chat template" in e.value.message
    ask = RECORD["messages"][1:2] + [{"role": "assistant", "content": "Sure."}]
    tool = {"role": "tool", "content": "18"}
    for record, key in (
        ({"messages": ask, "tools": TOOLS}, "tools"),
        ({"messages": [*ask, tool, *ask]}, "messages[2]"),
    ):
        with pytest.raises(BadRecord) as e:
            render(tok, messages_of(json.dumps(record)))
        assert e.value.key == key and "not rendered by the chat template" in e.value.message, e.value
