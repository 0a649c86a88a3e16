"""JSON-constrained decoding: token bytes, the automaton, schema compile, post-check."""
