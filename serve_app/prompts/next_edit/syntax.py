"""Whether a file's text parses: Python by ``ast``, other languages by their tree-sitter
grammar (the parser editors and Zed's edit predictions use), for the languages whose grammar
is installed (``GRAMMARS``). A language with none is not judged."""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import PurePosixPath
from typing import Any

PYTHON_SUFFIXES = (".py", ".pyi", ".pyw")
# File suffix -> (grammar module, its function giving the language).
GRAMMARS: dict[str, tuple[str, str]] = {
    **dict.fromkeys((".js", ".mjs", ".cjs", ".jsx"), ("tree_sitter_javascript", "language")),
    ".ts": ("tree_sitter_typescript", "language_typescript"),
    ".tsx": ("tree_sitter_typescript", "language_tsx"),
    ".go": ("tree_sitter_go", "language"),
    ".rs": ("tree_sitter_rust", "language"),
    ".java": ("tree_sitter_java", "language"),
    **dict.fromkeys((".c", ".h"), ("tree_sitter_c", "language")),
    **dict.fromkeys((".cc", ".cpp", ".cxx", ".hpp", ".hh"), ("tree_sitter_cpp", "language")),
}


def parses(path: str, source: str) -> bool | None:
    """Whether ``source``, the text of a file named ``path``, parses; None where no parser
    for its language is here."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in PYTHON_SUFFIXES:
        return parses_as_python(source)
    language = _language(suffix)
    if language is None:
        return None
    from tree_sitter import Parser

    # A parser each call: answers are read on worker threads, and a Parser is not shared.
    tree = Parser(language).parse(source.encode("utf-8", errors="surrogatepass"))
    return not tree.root_node.has_error


def parses_as_python(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


@functools.cache
def _language(suffix: str) -> Any | None:
    grammar = GRAMMARS.get(suffix)
    if grammar is None:
        return None
    try:
        from tree_sitter import Language

        module = importlib.import_module(grammar[0])
    except ImportError:
        return None
    return Language(getattr(module, grammar[1])())
