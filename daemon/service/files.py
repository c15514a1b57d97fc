"""Shared files (docs/ipc.md, "Files"): share a local file with members, get one announced to
this member, list both.

Share: hash the file (SHA-256, read in chunks on a thread), derive its id, open the upload at
the broker (which answers how many chunks it already holds), send the rest in order with
``files.window`` chunks in flight (a DM's sealed under the file's key), close it, then
announce it through the outbox like any send, under an id derived from the file: a share
retried after any cut, the daemon's own death included, resumes where the broker stands and
is announced once. Get: fetch the chunks in order with the same window into ``OUT.part``
beside a small state file, hashing as they land; a download cut off resumes after the whole
chunks written. On a hash mismatch both are deleted and nothing is written; otherwise the
part is fsynced and renamed to ``OUT``. No file is ever whole in memory: at most a window
of chunks is.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from tidemesh.core import files as core_files
from tidemesh.core.errors import (
    Conflict,
    InsufficientStorage,
    InvalidRequest,
    NotFound,
    Unavailable,
)
from tidemesh.core.files import FileIntegrityError, FileMeta
from tidemesh.core.send import Destination, DestinationKind, SendRequest, parse_send_request
from tidemesh.daemon import safe_files
from tidemesh.daemon.link.live_link import LiveLink, file_answer
from tidemesh.daemon.records import SendOutcome
from tidemesh.daemon.service import file_parts
from tidemesh.daemon.service.disk import DiskMonitor
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.store import files as files_store
from tidemesh.daemon.store.db import Database

log = structlog.get_logger(__name__)
# How long a share or get waits for the broker link to come back before it gives up (503;
# the caller's retry then resumes where it stopped).
RELINK_WAIT_S = 30.0
_ATTEMPTS = 5
_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class FileSettings:
    chunk_bytes: int = core_files.DEFAULT_CHUNK_BYTES
    window: int = 8


@dataclass(frozen=True, slots=True)
class Shared:
    file: FileMeta
    outcome: SendOutcome
    resumed_from: int       # chunks the broker already held when this share began
    sent_chunks: int


@dataclass(frozen=True, slots=True)
class Fetched:
    file: FileMeta
    path: Path
    resumed_from: int       # chunks already written by an earlier, cut-off get


def _hash_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(_READ_BYTES):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def _pread(fd: int, size: int, offset: int) -> bytes:
    return os.pread(fd, size, offset)


class FileService:
    def __init__(self, db: Database, live: Callable[[], LiveLink | None], outbox: OutboxService,
                 disk: DiskMonitor, secret: bytes, pubkey: str, spool: Path,
                 settings: FileSettings = FileSettings(), clock: Callable[[], float] = time.time,
                 moved: Callable[[str, int], None] = lambda direction, n: None) -> None:
        self.db = db
        self.live = live
        self.outbox = outbox
        self.disk = disk
        self.secret = secret
        self.pubkey = pubkey
        self.spool = spool
        self.settings = settings
        self.clock = clock
        # Plaintext bytes through the link ("sent", "received"): cm_daemon_file_bytes_total.
        self.moved = moved
        # Shares (by file id) and gets (by target path) running now: a second one of the
        # same would write over the first's work, so it is refused while the first runs.
        self._running: set[str] = set()

    @contextlib.contextmanager
    def _alone(self, key: str, what: str) -> Iterator[None]:
        if key in self._running:
            raise Conflict(f"{what} is already running; wait for it (or run it again after "
                           "it ended to resume)", reason="file_transfer_running")
        self._running.add(key)
        try:
            yield
        finally:
            self._running.discard(key)

    def clear_spool(self) -> None:
        """Remove the copies of streamed gets a previous run left (at start, before IPC)."""
        shutil.rmtree(self.spool, ignore_errors=True)

    # -- the link, across cuts -------------------------------------------------------------

    async def _link(self) -> LiveLink:
        """The open link; waits up to ``RELINK_WAIT_S`` for the relay to reconnect."""
        deadline = asyncio.get_running_loop().time() + RELINK_WAIT_S
        while (link := self.live()) is None:
            if asyncio.get_running_loop().time() > deadline:
                raise Unavailable("the daemon is not connected to the broker; run the same "
                                  "command again to resume", reason="broker_disconnected")
            await asyncio.sleep(0.2)
        return link

    async def _retrying(self, step: Callable[[LiveLink], Any], what: str) -> Any:
        """Run ``step`` on the link, again on the next link after a cut (each run resumes
        where the last stopped)."""
        for attempt in range(1, _ATTEMPTS + 1):
            link = await self._link()
            try:
                return await step(link)
            except Unavailable as exc:
                if exc.details.get("reason") != "broker_disconnected" or attempt == _ATTEMPTS:
                    raise
                log.warning("file_transfer_link_lost", what=what, attempt=attempt,
                            error=exc.message)
                await asyncio.sleep(0.2)
        raise AssertionError("unreachable")

    # -- share -----------------------------------------------------------------------------

    async def share(self, path: str, to: Destination, message: str | None,
                    persistent: bool) -> Shared:
        src = file_parts.absolute(path, "path")
        try:
            before = await asyncio.to_thread(src.stat)
        except OSError as exc:
            raise NotFound(f"cannot read {src}: {exc.strerror}", field="path") from exc
        if not stat.S_ISREG(before.st_mode):
            raise InvalidRequest(f"{src} is not a regular file", field="path")
        self.disk.check_send()
        sha, size = await asyncio.to_thread(_hash_file, src)
        fid = core_files.file_id(self.secret, sha, to.kind.value, to.ref)
        key = (core_files.file_key(self.secret, fid).hex()
               if to.kind is DestinationKind.DM else None)
        fm = FileMeta(fid, core_files.safe_name(src.name), size, sha,
                      self.settings.chunk_bytes, key, persistent)
        req = self._announcement(fm, to, message)   # refused before any upload if invalid
        with self._alone(f"share:{fid}", f"a share of {src} to {to.kind.value}:{to.ref}"):
            fd = await asyncio.to_thread(os.open, src, os.O_RDONLY)
            try:
                have, sent = await self._retrying(lambda link: self._upload(link, fd, fm),
                                                  "share")
            finally:
                os.close(fd)
        after = await asyncio.to_thread(src.stat)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise Conflict(f"{src} changed while it was being shared; share it again",
                           reason="file_changed")
        outcome = await self.outbox.submit(req)
        rec = files_store.FileRecord(fm, "shared", self.pubkey, to.kind.value, to.ref, message,
                                     int(self.clock() * 1000))
        await self.db.write(partial(files_store.insert, rec=rec))
        log.info("file_shared", file_id=fid, size=size, chunks=fm.chunks, sealed=fm.sealed,
                 resumed_from=have, sent_chunks=sent)
        return Shared(fm, outcome, have, sent)

    def _announcement(self, fm: FileMeta, to: Destination, message: str | None) -> SendRequest:
        return parse_send_request({
            "to": to.to_dict(), "body": message if message else fm.name,
            "meta": fm.to_meta(), "client_message_id": core_files.client_message_id(fm.id)})

    async def _upload(self, link: LiveLink, fd: int, fm: FileMeta) -> tuple[int, int]:
        opened = await file_answer(await link.file_submit({
            "type": "file_open", "file_id": fm.id, "size": fm.size, "chunk_size": fm.chunk_size,
            "chunks": fm.chunks, "sealed": fm.sealed, "persistent": fm.persistent}))
        have = int(opened["have"])
        if opened["complete"]:
            return have, 0
        key = bytes.fromhex(fm.key) if fm.key is not None else None
        window: deque[asyncio.Future[dict[str, Any]]] = deque()
        try:
            for seq in range(have, fm.chunks):
                plain = await asyncio.to_thread(
                    _pread, fd, core_files.chunk_span(seq, fm.size, fm.chunk_size),
                    seq * fm.chunk_size)
                data = core_files.seal_chunk(key, seq, plain) if key is not None else plain
                window.append(await link.file_submit({
                    "type": "file_chunk", "file_id": fm.id, "seq": seq,
                    "data": base64.b64encode(data).decode("ascii")}))
                self.moved("sent", len(plain))
                if len(window) >= self.settings.window:
                    await file_answer(window.popleft())
            while window:
                await file_answer(window.popleft())
        finally:
            _drop(window)
        await file_answer(await link.file_submit({"type": "file_close", "file_id": fm.id}))
        return have, fm.chunks - have

    # -- get -------------------------------------------------------------------------------

    async def find(self, file_id: str) -> files_store.FileRecord:
        rec = await self.db.read(partial(files_store.find, file_id=file_id))
        if rec is None:
            raise NotFound(f"no file {file_id} was shared with or by this member",
                           reason="file_unknown")
        return rec

    async def get(self, file_id: str, out: str | None) -> Fetched:
        """Fetch the file to ``out`` (absolute), or when None to a spool file that the
        caller streams and removes; verified before it is there."""
        fm = (await self.find(file_id)).meta
        # A stream's copy is its request's alone; what a daemon that died left there goes at
        # the next start (``clear_spool``).
        target = (self.spool / f"{fm.id}.{secrets.token_hex(8)}" if out is None
                  else file_parts.absolute(out, "out"))
        with self._alone(f"get:{target}", f"a get to {target}"):
            return await self._get(fm, target, out is None)

    async def _get(self, fm: FileMeta, target: Path, spooled: bool) -> Fetched:
        if spooled:
            self.spool.mkdir(mode=0o700, exist_ok=True)
        elif not target.parent.is_dir():
            raise NotFound(f"no folder {target.parent} to write into", field="out")
        safe_files.check_target(target)
        part = target.with_name(target.name + ".part")
        state = target.with_name(target.name + ".part.json")
        fd, resume = await self._open_part(fm, target, part, state)
        try:
            hasher = await asyncio.to_thread(file_parts.hash_prefix, fd, resume.keep_bytes)
            progress = [resume.next_seq]
            await self._retrying(lambda link: self._download(link, fd, fm, hasher, progress),
                                 "get")
            if hasher.hexdigest() != fm.sha256:
                raise FileIntegrityError(
                    f"file {fm.id} does not match its announced SHA-256: the stored chunks were "
                    "changed; nothing was written", expected=fm.sha256,
                    got=hasher.hexdigest())
            await asyncio.to_thread(file_parts.finish, fd, part, target)
        except FileIntegrityError:
            # What was fetched cannot be trusted, the part already written included.
            for p in (part, state):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            raise
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            state.unlink()
        log.info("file_fetched", file_id=fm.id, size=fm.size, resumed_from=resume.next_seq)
        return Fetched(fm, target, resume.next_seq)

    async def _open_part(self, fm: FileMeta, target: Path, part: Path, state: Path
                         ) -> tuple[int, core_files.Resume]:
        """The part's descriptor, cut back to the whole chunks it may be resumed from, and
        its state written; created only once the rest of the file is known to fit."""
        held = await asyncio.to_thread(safe_files.open_ours, part)
        try:
            resume = core_files.resume_point(
                fm, await asyncio.to_thread(file_parts.read_state, state),
                os.fstat(held).st_size if held is not None else 0)
            self._check_room(target, fm.size - resume.keep_bytes)
            fd = held if held is not None else await asyncio.to_thread(
                safe_files.create_private, part)
        except BaseException:
            if held is not None:
                os.close(held)
            raise
        try:
            await asyncio.to_thread(file_parts.write_state, state, fm)
            os.ftruncate(fd, resume.keep_bytes)
        except BaseException:
            os.close(fd)
            raise
        return fd, resume

    def _check_room(self, target: Path, more: int) -> None:
        """Room for the ``more`` bytes still to come: on the daemon's own file system above
        its floor (disk.reserved_bytes), elsewhere at least the bytes themselves."""
        here = os.statvfs(target.parent)
        free = here.f_bavail * here.f_frsize
        floor = 0
        if os.stat(target.parent).st_dev == os.stat(self.disk.data_dir).st_dev:
            floor = self.disk.state().floor_bytes
        if free - more < floor:
            raise InsufficientStorage(
                f"the file needs {more} more bytes and {target.parent} has {free} free"
                + (f", under the floor of {floor} (disk.reserved_bytes)" if floor else "")
                + "; nothing was fetched", free_bytes=free, floor_bytes=floor)

    async def _download(self, link: LiveLink, fd: int, fm: FileMeta, hasher: Any,
                        progress: list[int]) -> None:
        key = bytes.fromhex(fm.key) if fm.key is not None else None
        window: deque[asyncio.Future[dict[str, Any]]] = deque()
        asked = progress[0]
        try:
            while progress[0] < fm.chunks:
                while asked < fm.chunks and len(window) < self.settings.window:
                    window.append(await link.file_submit(
                        {"type": "file_fetch", "file_id": fm.id, "seq": asked}))
                    asked += 1
                seq = progress[0]
                answer = await file_answer(window.popleft())
                plain = self._opened(answer, fm, key, seq)
                await asyncio.to_thread(os.pwrite, fd, plain, seq * fm.chunk_size)
                self.moved("received", len(plain))
                hasher.update(plain)
                progress[0] = seq + 1
        finally:
            _drop(window)

    @staticmethod
    def _opened(answer: dict[str, Any], fm: FileMeta, key: bytes | None, seq: int) -> bytes:
        if answer.get("seq") != seq:
            raise FileIntegrityError(f"the broker answered chunk {answer.get('seq')} for {seq}")
        data = base64.b64decode(answer["data"])
        plain = core_files.open_chunk(key, seq, data) if key is not None else data
        if len(plain) != core_files.chunk_span(seq, fm.size, fm.chunk_size):
            raise FileIntegrityError(f"chunk {seq} has {len(plain)} bytes, not the file's "
                                     f"{core_files.chunk_span(seq, fm.size, fm.chunk_size)}",
                                     seq=seq)
        return plain

    async def stream(self, fetched: Fetched) -> AsyncGenerator[bytes, None]:
        """The bytes of a spooled get, then the spool file removed."""
        try:
            with fetched.path.open("rb") as f:
                while block := await asyncio.to_thread(f.read, _READ_BYTES):
                    yield block
        finally:
            with contextlib.suppress(FileNotFoundError):
                fetched.path.unlink()

    # -- list ------------------------------------------------------------------------------

    async def list(self, limit: int) -> dict[str, Any]:
        return {"files": await self.db.read(partial(files_store.page, limit=limit))}


def _drop(window: deque[asyncio.Future[dict[str, Any]]]) -> None:
    """Forget the answers still awaited (a cut or a refusal): retrieved, so never logged."""
    for fut in window:
        if fut.done() and not fut.cancelled():
            fut.exception()
        else:
            fut.cancel()
