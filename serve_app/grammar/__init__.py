"""Grammars for constrained decoding on llguidance: a client's JSON schema checked and
compiled (``schema``), matchers per tokenizer (``matcher``), the answer's post-check
(``postcheck``), and every token's bytes (``token_bytes``)."""
