"""Apply: merge an update snippet into a file without losing a line (docs/apply.md).

- ``update``: the update's elision markers and the chunks of code between them, and how a line
  of the update is compared with a line of the original.
- ``placement``: where each chunk lands in the original (a ``Plan``), and the deterministic
  merge when every chunk lands in exactly one place.
- ``check``: the one check every answer passes, whoever wrote it (the deterministic merge or
  the model): every original line is kept, replaced by a chunk, or deleted by one.
"""
