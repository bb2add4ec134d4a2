"""Chat-formatted prompts as lm-evaluation-harness's HF backend writes them: the tokenizer's own
chat template over lm-eval's turns (its ``--apply_chat_template``), the system turn left out
where the template refuses one."""

from __future__ import annotations

from typing import Any

from tango.common.exceptions import ConfigurationError


def apply_chat_template(
    tokenizer: Any, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
) -> str:
    """``chat_history`` as text in the tokenizer's chat template: with the assistant's opening
    when ``add_generation_prompt``, else continuing the last message (lm-eval's ``HFLM``)."""
    import jinja2

    options = {
        "tokenize": False,
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": not add_generation_prompt,
    }
    try:
        return str(tokenizer.apply_chat_template(chat_history, **options))
    except jinja2.exceptions.TemplateError:  # a template without a system role
        turns = [turn for turn in chat_history if turn["role"] != "system"]
        return str(tokenizer.apply_chat_template(turns, **options))


def check_chat_template(tokenizer: Any, task: str) -> None:
    """Refuse ``apply_chat_template`` for a tokenizer that has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigurationError(
            f"task {task!r} asks for apply_chat_template, and the model's tokenizer has no chat "
            "template (tokenizer_config.json's chat_template); set apply_chat_template to false"
        )
