"""envs/transcript.py: the text after an assistant's turn when the model has more than one
end-of-sequence token (Qwen's and SmolLM2's <|im_end|> and <|endoftext|>, whose ChatML template
closes a turn with the first alone)."""

import pytest

from rlpost.envs.transcript import TemplateError, chat_delta
from rlpost.model.load import load_tokenizer

# Two assistant turns: the template's first <|im_end|> closes the user's turn, an earlier one the first
# assistant turn; the turn's own end is the last of them, whichever end-of-sequence text is listed first.
HISTORY = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
           {"role": "user", "content": "r"}, {"role": "assistant", "content": "b"}]
NEW = [{"role": "user", "content": "s"}]
AFTER = "\n<|im_start|>user\ns<|im_end|>\n<|im_start|>assistant\n"  # ChatML's newline, the turn, the prompt


@pytest.mark.parametrize("eos_texts", [["<|endoftext|>", "<|im_end|>"], ["<|im_end|>", "<|endoftext|>"]])
def test_a_turn_ends_at_the_last_end_of_sequence_text_the_template_wrote(eos_texts):
    tok = load_tokenizer("embedded")
    assert tok.convert_tokens_to_ids("<|endoftext|>") != tok.eos_token_id  # two end tokens, one in the template
    assert chat_delta(tok, HISTORY, NEW, None, eos_texts, closed=True) == AFTER
    # a turn cut at max_new_tokens drew no end token: the one the template closes with comes first
    assert chat_delta(tok, HISTORY, NEW, None, eos_texts, closed=False) == "<|im_end|>" + AFTER


def test_a_template_closing_with_no_end_of_sequence_text_is_refused():
    tok = load_tokenizer("embedded")
    with pytest.raises(TemplateError, match="does not end an assistant message with an end-of-sequence token"):
        chat_delta(tok, HISTORY, NEW, None, ["<|endoftext|>"], closed=True)
