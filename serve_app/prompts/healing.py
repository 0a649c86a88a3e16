"""Token healing: the text right before the cursor given back to the model to spell again.

Its own module because it reads the vocabulary's bytes (``TokenTexts``, which needs torch),
while the prompt builders are imported by the configuration, which replicas without a model
load too.
"""

from __future__ import annotations

import re

from serve_app.grammar.token_bytes import TokenTexts

# Token healing (heal_cursor): what the tokens it takes off may spell, together: the cursor's
# word as typed so far, with the blanks around it and the punctuation right before it
# (``"        ret"``, ``".jo"``, ``", "``, a docstring's quotes), never a newline; and how
# many tokens at most.
_HEALABLE = re.compile(r"[ \t]*[^\w\s]*\w*[ \t]*")
MAX_HEALED_TOKENS = 6


def heal_cursor(
    token_texts: TokenTexts, prompt_ids: list[int], prefix: str
) -> tuple[list[int], str]:
    """Token healing at the cursor: ``(prompt_ids, answer_prefix)``.

    The text before a cursor is tokenised as the model rarely saw it in training: a word
    typed halfway (``retu`` is `` ret`` + ``u``; the whole word is one token, `` return``),
    or the indentation after Enter (``"    "`` is one token, but before code the model saw
    ``"   "`` + ``" if"``). So the model continues it badly (an extra space before the
    line's code), and as a word grows its tokens change on every keystroke. When the prompt
    ends with ``prefix`` (``spm``: the prefix is last), its last tokens, as long as together
    they spell the cursor's word with the blanks around it (``_HEALABLE``, at most
    ``MAX_HEALED_TOKENS``), are taken off and become the answer's prefix: the model spells
    it again with tokens of its choice (``GenerationRequest.answer_prefix``), and the client
    gets only what follows. The keystrokes of a line's first word then all send the prompt
    that the line's first request sent: the prefix cache holds it whole, and while the user
    types what was suggested, the suggestion is the answer (``engine.reuse``).
    """
    text, taken = "", 0
    # At least one token stays: the model reads something before it writes.
    while taken < min(MAX_HEALED_TOKENS, len(prompt_ids) - 1):
        try:
            longer = token_texts.token_bytes[prompt_ids[-taken - 1]].decode() + text
        except UnicodeDecodeError:  # part of a character: stop before it
            break
        if not longer or not _HEALABLE.fullmatch(longer) or not prefix.endswith(longer):
            break
        text, taken = longer, taken + 1
    return (prompt_ids[:-taken], text) if taken else (prompt_ids, "")
