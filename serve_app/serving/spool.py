"""Ledger rows kept on the replica's disk while the auth store cannot take them.

A request that was admitted finishes even if the store goes away meanwhile (a PostgreSQL
restart, a SQLite file held locked): its ledger row is appended to this replica's spool file,
flushed to disk, and written to the store once it is back. The store keeps one row per request
id (``usage_ledger.request_id`` is unique, written insert-if-absent), so a row is sent again
as often as needed and charged once: a flush that fails halfway sends the whole file again.

Each replica appends to a file of its own, which it holds an exclusive ``flock`` on while it
lives. A file whose lock anyone can take is an orphan (its replica died before it could flush):
the next replica on the machine to flush adopts it, writes its rows and deletes it.

Rows are pickled ``(context, input_tokens, output_tokens, status)``, the arguments of the
ledger's ``write``, each framed by its length; a frame cut short by a crash mid-append is
dropped on reading (its request was not answered: the write happens before the answer). The
folder is the service's own data directory (mode 0700), beside the auth store's file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pickle
import socket
import struct
import threading
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SUFFIX = ".spool"
FRAME = struct.Struct("<I")
Row = tuple[Any, int, int, int]  # (RequestContext, input tokens, output tokens, status)


class LedgerSpool:
    """This replica's spool file in ``folder``, and the orphans it may adopt."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.folder = folder
        name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        self.path = folder / name
        self._file: Any = None  # opened, and locked for this replica's life, at the first row
        self._mutex = threading.Lock()

    def keep(self, row: Row) -> None:
        """Append ``row`` and flush it to disk before returning."""
        frame = pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
        with self._mutex:
            if self._file is None:
                # Locked before it has its name: no other replica ever sees it unlocked (and
                # adopts, then deletes, a file this one goes on appending to).
                fresh = self.path.with_suffix(".new")
                fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
                self._file = os.fdopen(fd, "r+b")
                fcntl.flock(self._file, fcntl.LOCK_EX)
                fresh.rename(self.path)
            self._file.write(FRAME.pack(len(frame)) + frame)
            self._file.flush()
            os.fsync(self._file.fileno())

    def held(self) -> int:
        """Bytes of rows this replica holds (0: nothing to flush)."""
        return self.path.stat().st_size if self._file is not None else 0

    async def flush(self, write: Callable[..., Awaitable[None]]) -> int:
        """Send this replica's rows, then every orphan's, through ``write``; a file whose rows
        were all written is emptied (this replica's) or deleted (an orphan's). The rows
        written; a failure leaves the file for the next flush."""
        written = 0
        size = self.held()
        if size:
            written += await _send(_read(self.path, size), write)
            self._drop_first(size)
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            if path != self.path:
                written += await self._adopt(path, write)
        return written

    def orphans(self) -> bool:
        return any(path != self.path for path in self.folder.glob(f"*{SUFFIX}"))

    def close(self) -> None:
        """Release the lock (rows not flushed stay in the file, for another replica)."""
        with self._mutex:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _drop_first(self, size: int) -> None:
        """Remove the first ``size`` bytes (rows written); rows appended since stay."""
        with self._mutex:
            self._file.seek(size)
            rest = self._file.read()
            self._file.truncate(0)
            self._file.write(rest)
            self._file.flush()
            os.fsync(self._file.fileno())

    async def _adopt(self, path: Path, write: Callable[..., Awaitable[None]]) -> int:
        """An orphan's rows written and its file deleted, holding its lock meanwhile."""
        try:
            with open(path, "rb") as file:
                try:
                    fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # its replica lives, or another one is adopting it
                    return 0
                rows = _read(path, os.fstat(file.fileno()).st_size)
                written = await _send(rows, write)
                path.unlink(missing_ok=True)
        except FileNotFoundError:  # another replica adopted it meanwhile
            return 0
        logger.info("ledger spool: %d rows of %s written", written, path.name)
        return written


def _read(path: Path, size: int) -> list[Row]:
    """The whole frames among the first ``size`` bytes of ``path``."""
    data = path.read_bytes()[:size]
    rows, offset = [], 0
    while offset + FRAME.size <= len(data):
        (length,) = FRAME.unpack_from(data, offset)
        start, offset = offset + FRAME.size, offset + FRAME.size + length
        if offset > len(data):
            logger.warning("ledger spool %s: a row cut short by a crash is dropped", path.name)
            break
        rows.append(pickle.loads(data[start:offset]))
    return rows


async def _send(rows: list[Row], write: Callable[..., Awaitable[None]]) -> int:
    """Write every row; the first failure stops (and propagates: the file stays)."""
    for row in rows:
        await write(*row)
    return len(rows)
