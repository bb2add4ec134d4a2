"""Chat-formatted prompts (``data/chat.py``) as lm-eval's HF backend writes them: the tokenizer's
template with the assistant's opening or continuing the last turn, the system turn left out where
the template refuses one, and a one-line refusal for a tokenizer without a template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tango.common.exceptions import ConfigurationError

from tango_fairscale.data.chat import apply_chat_template, check_chat_template

#: A template in the usual shape: each turn tagged, the assistant's opening on request.
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
#: A template that refuses a system turn (as Gemma's does).
NO_SYSTEM = (
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
]


def tokenizer(tokenizer_dir: Path, template: str | None) -> Any:
    from transformers import PreTrainedTokenizerFast

    made = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
    made.chat_template = template
    return made


def test_the_template_opens_the_assistants_turn(tokenizer_dir: Path) -> None:
    text = apply_chat_template(tokenizer(tokenizer_dir, TEMPLATE), HISTORY)
    assert text == "<system>Be brief.</system><user>2+2?</user><assistant>"


def test_without_the_opening_the_last_turn_is_continued(tokenizer_dir: Path) -> None:
    history = [*HISTORY, {"role": "assistant", "content": "It is"}]
    text = apply_chat_template(tokenizer(tokenizer_dir, TEMPLATE), history, False)
    assert text.endswith("<assistant>It is")  # open: the answer continues it


def test_a_template_that_refuses_a_system_turn_gets_none(tokenizer_dir: Path) -> None:
    text = apply_chat_template(tokenizer(tokenizer_dir, NO_SYSTEM), HISTORY)
    assert text == "[user] 2+2?\n[assistant]"


def test_a_tokenizer_without_a_template_is_refused_in_one_line(tokenizer_dir: Path) -> None:
    check_chat_template(tokenizer(tokenizer_dir, TEMPLATE), "piqa")
    with pytest.raises(ConfigurationError) as error:
        check_chat_template(tokenizer(tokenizer_dir, None), "piqa")
    assert str(error.value).startswith(
        "task 'piqa' asks for apply_chat_template, and the model's tokenizer has no chat template"
    )
    assert "\n" not in str(error.value)
