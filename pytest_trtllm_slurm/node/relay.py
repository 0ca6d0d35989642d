"""The login node's end of the wire: one process per run on one kept SSH channel; it runs the
controller's commands (an sshd session each costs 0.2 s) and pushes what watched files gain.

Stdlib only, one file, Python 3.6+ (type comments): the controller sends this file's text
as ``python3 -c``. It ends when its stdin closes.

Lines in (one JSON object each):
    {"op": "run", "id": N, "argv": [...], "env": {...}|null, "cwd": str|null,
     "input": str|null, "timeout": float|null}
    {"op": "run", ..., "stream": true}                stdin comes as "stdin" lines:
    {"op": "stdin", "id": N, "data": base64}          a piece of a streamed stdin
    {"op": "stdin", "id": N, "eof": true}             its end (a command that ends first
                                                      is answered then; later pieces dropped)
    {"op": "read" | "size" | "write" | "mkdir" | "remove" | "await" | "batch", "id": N,
     "path", ...}: one file operation (``FILE_OPS``), one round trip; the answer has its
     result ("data", "size", "answers"...) or "errno" and "error"
    {"op": "watch", "path": str, "offset": int}      push what follows ``offset``
    {"op": "ack", "path": str, "offset": int}        the controller has read to ``offset``
    {"op": "unwatch", "path": str}
Lines out:
    {"ready": VERSION}                                once, first
    {"id": N, "rc": int, "out": str, "err": str, "timed_out": bool}
    {"push": path, "offset": int, "data": base64}    bytes of path from offset
    {"took": N, "bytes": int}                         a streamed stdin's piece was written

Flow control, both ways: a watched file is pushed at most ``PUSH_WINDOW`` bytes ahead of
the controller's ack, a streamed stdin sent at most ``STDIN_WINDOW`` bytes ahead of
``took`` (and queued here at most ``STDIN_QUEUE`` pieces)."""

import base64
import contextlib
import errno
import json
import os
import queue
import stat
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any, Dict, Optional  # noqa: F401, UP035 - used by type comments

VERSION = 1
# seconds between two looks at the watched files: short while they grow, up to WATCH_MAX
WATCH_MIN, WATCH_MAX, WATCH_GROWTH = 0.02, 0.2, 1.5
PUSH_LIMIT = 1 << 20  # bytes per push line
PUSH_WINDOW = 8 << 20  # bytes of a watched file pushed ahead of the controller's last ack
STDIN_WINDOW = 4 << 20  # bytes of a streamed stdin the controller sends ahead of "took"
STDIN_QUEUE = 32  # pieces (at most 256 KiB each) of a streamed stdin queued here
# seconds between two looks at a streamed command waiting for input (has it ended?)
STREAM_LOOK = 0.5
EVENT_FLOOR = 0.002  # seconds between two reads of the folder events (a burst merges meanwhile)


class FolderEvents:
    """Linux's inotify on the folders of the watched files: a write or a rename there wakes the
    watch loop, which pushes that file at once instead of at its next look (up to
    ``WATCH_MAX`` late). NFS shows no event for another client's writes, and there is no
    inotify off Linux: there the looks alone find them, as before."""

    IN_MODIFY, IN_MOVED_TO, IN_CREATE, IN_Q_OVERFLOW, IN_IGNORED = 0x2, 0x80, 0x100, 0x4000, 0x8000
    IN_ONLYDIR, IN_DONT_FOLLOW, IN_CLOEXEC = 0x01000000, 0x02000000, 0o2000000
    EVENT = "iIII"  # wd, mask, cookie, len (then the name, NUL-padded)

    def __init__(self, changed):
        # type: (Any) -> None
        """``changed(path or None)``: a file of a watched folder changed (None: any may have)."""
        self._changed = changed
        self._fd = -1
        self._libc = None  # type: Any
        self._folders = {}  # type: Dict[str, int]  # folder -> watch descriptor
        self._by_wd = {}  # type: Dict[int, str]
        self._lock = threading.Lock()  # both maps: the watch loop's and the reader's
        if not sys.platform.startswith("linux"):
            return
        try:
            import ctypes  # not in every Python build (no libffi): then the looks alone

            libc = ctypes.CDLL(None, use_errno=True)
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
            fd = libc.inotify_init1(self.IN_CLOEXEC)
        except (ImportError, OSError, AttributeError):
            return
        if fd >= 0:
            self._libc, self._fd = libc, fd
            threading.Thread(target=self._read, daemon=True).start()

    def want(self, folders):
        # type: (set[str]) -> None
        """Watch exactly ``folders`` (one not there yet is tried again at the next call); a
        link planted as a folder is not followed."""
        if self._fd < 0:
            return
        mask = (self.IN_MODIFY | self.IN_MOVED_TO | self.IN_CREATE | self.IN_ONLYDIR
                | self.IN_DONT_FOLLOW)
        with self._lock:
            for folder in [f for f in self._folders if f not in folders]:
                wd = self._folders.pop(folder)
                self._by_wd.pop(wd, None)
                self._libc.inotify_rm_watch(self._fd, wd)
            for folder in folders:
                if folder not in self._folders:
                    wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), mask)
                    if wd >= 0:
                        self._folders[folder] = wd
                        self._by_wd[wd] = folder

    def _read(self):
        # type: () -> None
        size = struct.calcsize(self.EVENT)
        while True:
            try:
                data = os.read(self._fd, 65536)
            except OSError:
                return
            at = 0
            while at + size <= len(data):
                wd, mask, _, length = struct.unpack_from(self.EVENT, data, at)
                name = data[at + size:at + size + length].rstrip(b"\0")
                at += size + length
                with self._lock:
                    folder = self._by_wd.get(wd)
                    if mask & self.IN_IGNORED and folder is not None:  # the folder went:
                        del self._by_wd[wd]  # one made again there is watched anew
                        self._folders.pop(folder, None)
                if mask & self.IN_Q_OVERFLOW:
                    self._changed(None)
                elif folder is not None and name:
                    self._changed(os.path.join(folder, os.fsdecode(name)))
            # a chatty writer's events merge in the kernel meanwhile (identical ones queued
            # back to back are one): this thread wakes at most every EVENT_FLOOR s
            time.sleep(EVENT_FLOOR)


class Relay:
    """Reads requests from ``stdin``, answers and pushes on ``stdout`` (one writer lock)."""

    def __init__(self, stdin, stdout):
        # type: (IO[bytes], IO[bytes]) -> None
        self._in = stdin
        self._out = stdout
        self._out_lock = threading.Lock()
        self._watched = {}  # type: dict[str, int]
        self._acked = {}  # type: dict[str, int]  # what the controller has read, by path
        self._watch_lock = threading.Lock()
        self._stop = threading.Event()
        self._new_watch = threading.Event()  # a new watch or an ack: look at every file
        self._wake = threading.Event()  # the watch loop's: that, or a folder event
        self._dirty = set()  # type: set[str]  # watched files a folder event named
        self._streams = {}  # type: Dict[int, queue.Queue[Optional[bytes]]]

    def send(self, message):
        # type: (Dict[str, Any]) -> None
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._out_lock:
            try:
                self._out.write(line)
                self._out.flush()
            except (OSError, ValueError):  # the channel is gone: nothing to tell anyone
                self._stop.set()

    def serve(self):
        # type: () -> None
        self.send({"ready": VERSION})
        watcher = threading.Thread(target=self._watch_loop, daemon=True)
        watcher.start()
        for raw in self._in:
            try:
                request = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(request, dict):
                continue
            op = request.get("op")
            if op == "run":
                if request.get("stream"):  # before any of its stdin lines is read
                    self._streams[request["id"]] = queue.Queue(STDIN_QUEUE)
                threading.Thread(target=self._run, args=(request,), daemon=True).start()
            elif op == "stdin":
                self._queue(int(request.get("id") or 0), None if request.get("eof") else
                            base64.b64decode(request.get("data") or ""))
            elif op in FILE_OPS:
                threading.Thread(target=self._file_op, args=(request,), daemon=True).start()
            elif op == "watch":
                with self._watch_lock:
                    path, offset = str(request["path"]), int(request.get("offset") or 0)
                    self._watched[path] = self._acked[path] = offset
                self._new_watch.set()  # a new batch: look often again
                self._wake.set()
            elif op == "ack":
                with self._watch_lock:
                    path = str(request["path"])
                    if path in self._acked:
                        self._acked[path] = max(self._acked[path],
                                                int(request.get("offset") or 0))
                self._new_watch.set()  # room again: push at once
                self._wake.set()
            elif op == "unwatch":
                with self._watch_lock:
                    self._watched.pop(str(request["path"]), None)
                    self._acked.pop(str(request["path"]), None)
        self._stop.set()
        self._wake.set()  # the watch loop ends now
        for ident in list(self._streams):
            self._queue(ident, None)

    def _queue(self, ident, piece):
        # type: (int, Optional[bytes]) -> None
        """``piece`` (None: the end) of a streamed stdin to its command; waits on a full queue."""
        pieces = self._streams.get(ident)
        while pieces is not None:
            try:
                pieces.put(piece, timeout=STREAM_LOOK)
                return
            except queue.Full:
                pieces = self._streams.get(ident)

    def _file_op(self, request):
        # type: (Dict[str, Any]) -> None
        self.send(dict(_answer(request), id=request["id"]))

    def _run(self, request):
        # type: (Dict[str, Any]) -> None
        argv = [str(a) for a in request["argv"]]
        env = None  # type: Optional[Dict[str, str]]
        if request.get("env"):
            env = dict(os.environ)
            env.update({str(k): str(v) for k, v in request["env"].items()})
        data = request.get("input")
        pieces = self._streams.get(request["id"])
        answer = {"id": request["id"], "rc": 0, "out": "", "err": "",
                  "timed_out": False}  # type: Dict[str, Any]
        cwd = request.get("cwd") or None
        if cwd and not os.path.isdir(cwd):  # what ``cd DIR && ...`` says over a login shell
            answer.update(rc=1, err=f"cd: {cwd}: No such file or directory")
            self.send(answer)
            return
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env,
                stdin=subprocess.PIPE if data is not None or pieces else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:  # as a login shell says it: not found 127, not runnable 126
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            answer.update(rc=code, err=f"{argv[0]}: {exc.strerror or exc}")
            self._streams.pop(request["id"], None)
            self.send(answer)
            return
        try:
            if pieces is not None:
                out, err = self._streamed(proc, pieces, request.get("timeout"), request["id"])
                self._streams.pop(request["id"], None)
            else:
                out, err = proc.communicate(data.encode() if data is not None else None,
                                            timeout=request.get("timeout"))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate() if pieces is None else (b"", b"")
            answer["timed_out"], answer["rc"] = True, 124
        else:
            answer["rc"] = proc.returncode
        answer["out"] = out.decode("utf-8", "replace")
        answer["err"] = err.decode("utf-8", "replace")
        self.send(answer)

    def _streamed(self, proc, pieces, timeout, ident):
        # type: (subprocess.Popen[bytes], queue.Queue[Optional[bytes]], Optional[float], int) -> Any
        """Feed ``pieces`` to the process's stdin while its output is read; each piece
        written (or dropped) is told to the controller (``took``)."""
        outputs = {}  # type: Dict[str, bytes]

        def drain(name, stream):
            # type: (str, IO[bytes]) -> None
            outputs[name] = stream.read()

        readers = [threading.Thread(target=drain, args=(name, stream), daemon=True)
                   for name, stream in (("out", proc.stdout), ("err", proc.stderr))]
        for reader in readers:
            reader.start()
        stdin, broken = proc.stdin, False
        assert stdin is not None
        while True:
            try:
                piece = pieces.get(timeout=STREAM_LOOK)
            except queue.Empty:
                piece = b""
            if piece is None:
                break
            if proc.poll() is not None:  # it ended before its input did: answer now (the
                break  # rest is dropped; the client's writes fail from the answer on)
            if piece and not broken:
                try:
                    stdin.write(piece)
                    stdin.flush()
                except OSError:  # it stopped reading: the rest is dropped, its exit code says
                    broken = True
            if piece:
                self.send({"took": ident, "bytes": len(piece)})
        with contextlib.suppress(OSError):
            stdin.close()
        proc.wait(timeout)  # TimeoutExpired: the caller kills it
        for reader in readers:
            reader.join()
        return outputs.get("out", b""), outputs.get("err", b"")

    def _changed(self, path):
        # type: (Optional[str]) -> None
        """A folder event (``FolderEvents``): push ``path`` now (None: look at every file)."""
        with self._watch_lock:
            if path is None:
                self._dirty.update(self._watched)
            elif path in self._watched:
                self._dirty.add(path)
            else:
                return
        self._wake.set()

    def _watch_loop(self):
        # type: () -> None
        """Looks at every watched file every ``WATCH_MIN`` to ``WATCH_MAX`` s (often while they
        grow), and at once at a file a folder event names."""
        events = FolderEvents(self._changed)
        interval, next_look = WATCH_MIN, 0.0
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_look - time.monotonic()))
            self._wake.clear()
            with self._watch_lock:
                fresh = self._new_watch.is_set()  # a new watch or an ack: look at all, often
                self._new_watch.clear()
                dirty, self._dirty = self._dirty, set()
                watched = [(path, offset, self._acked.get(path, offset) + PUSH_WINDOW - offset)
                           for path, offset in self._watched.items()]
            now = time.monotonic()
            look = fresh or now >= next_look
            grew = False
            for path, offset, room in watched:
                if room > 0 and (look or path in dirty):  # else not read yet by the controller
                    grew = self._push(path, offset, min(room, PUSH_LIMIT)) or grew
            if look:
                interval = WATCH_MIN if grew or fresh else min(interval * WATCH_GROWTH,
                                                               WATCH_MAX)
                next_look = now + interval
                events.want({os.path.dirname(path) for path, _, _ in watched})

    def _push(self, path, offset, limit):
        # type: (str, int, int) -> bool
        """Send what ``path`` has past ``offset`` (at most ``limit`` bytes); whether any."""
        try:  # open first: on NFS an open revalidates the size, a bare stat may be stale
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(limit)
        except OSError:
            return False  # not there yet
        if not data:
            return False
        with self._watch_lock:
            if self._watched.get(path) != offset:
                return False  # unwatched (or moved) meanwhile
            self._watched[path] = offset + len(data)
        self.send({"push": path, "offset": offset,
                   "data": base64.b64encode(data).decode("ascii")})
        return True


def _read(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    """``limit`` bytes of ``path`` from ``offset`` (none when absent)."""
    try:
        with open(request["path"], "rb") as fh:
            fh.seek(int(request["offset"]))
            data = fh.read(int(request["limit"]))
    except FileNotFoundError:
        data = b""
    return {"data": base64.b64encode(data).decode("ascii")}


def _size(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    """The size of ``path``; 0 and "absent" when it is."""
    try:
        return {"size": os.stat(request["path"]).st_size}
    except FileNotFoundError:
        return {"size": 0, "absent": True}


def _why_untrusted(st, directory):
    # type: (os.stat_result, bool) -> Optional[str]
    """As node/files.why_untrusted (this file travels alone: a copy)."""
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not kind_ok:
        return "it is not a " + ("folder" if directory else "regular file")
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others may write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _refuse_untrusted_dir(folder):
    # type: (str) -> None
    """OSError(EPERM) unless ``folder`` is a real folder of ours nobody else may write."""
    why = _why_untrusted(os.lstat(folder), True)
    if why is not None:
        raise OSError(errno.EPERM, f"{folder}: {why}; refusing to use it (someone else could put "
                      "files there or swap ours): remove it and run again")


def _refuse_foreign_links(path):
    # type: (str) -> None
    """OSError(EPERM) naming ``path`` or the first parent that is a link not ours or root's."""
    while path:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.geteuid(), 0):
            raise OSError(errno.EPERM, f"{path}: it is a symbolic link owned by uid "
                          f"{st.st_uid}; refusing to make or use folders through it")
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent


def _write(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    """``data`` (base64) to ``path`` as node/files.write_atomic: an unpredictable name
    opened O_EXCL|O_NOFOLLOW, 0600 from the first byte, chmod ``mode``, fsync (not for an
    empty signal file), rename."""
    path = request["path"]
    folder, base = os.path.split(path)
    tmp = os.path.join(folder, f".{base}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), int(request["mode"]))
            data = base64.b64decode(request["data"])
            fh.write(data)
            fh.flush()
            if data:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return {}


def _mkdir(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    """As node/files.make_dirs: ``mkdir -p`` with 0700 folders, each verified ours (EPERM),
    and so an existing ``path`` when ``private``."""
    path, private = request["path"].rstrip("/") or "/", bool(request.get("private"))
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    _refuse_foreign_links(path)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        _refuse_untrusted_dir(folder)
    if private and not missing:
        _refuse_untrusted_dir(path)
    return {}


AWAIT_MAX = 5.0  # seconds one await may last (the controller looks at its own side between)
AWAIT_LIMIT = 1 << 14  # bytes of the awaited file answered (a lock's holder record)
AWAIT_SOON, AWAIT_PAUSE_SOON = 0.25, 0.005  # an await's first 0.25 s: a look every 5 ms


def look_pause(pause, waited, most):
    # type: (float, float, float) -> float
    """The pause before the next look for a lock's holder (here and ``ShellLock.acquire``):
    1.5x the last, at most 5 ms for the first 0.25 s (a free lock lands within tens of ms, and
    each look late is a run's start late), then at most ``most`` (a lock held by another)."""
    return min(AWAIT_PAUSE_SOON if waited < AWAIT_SOON else most, pause * 1.5)


def _await(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    """Wait here until ``path`` holds ``needle`` (a lock holder's record with our token): one
    round trip as soon as it lands; answers what the file holds, found or timed out."""
    needle = str(request["needle"]).encode()
    begin = time.monotonic()
    end = begin + min(float(request.get("timeout") or 0), AWAIT_MAX)
    pause = 0.002
    while True:
        try:
            with open(request["path"], "rb") as fh:
                data = fh.read(AWAIT_LIMIT)
        except FileNotFoundError:
            data = b""
        left = end - time.monotonic()
        if needle in data or left <= 0:
            return {"data": base64.b64encode(data).decode("ascii")}
        time.sleep(min(pause, left))
        pause = look_pause(pause, time.monotonic() - begin, 0.1)


def _remove(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    """``rm -f`` of ``path``: a link itself goes, never what it points to; absent is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(request["path"])
    return {}


def _batch(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    """Several file operations ("ops", no "id") in one round trip, in order, each exactly
    as alone: "answers", one per op done, stopping after the first that fails."""
    answers = []
    for op in request.get("ops") or []:
        if not isinstance(op, dict) or op.get("op") not in BATCHED:
            answers.append({"errno": errno.EINVAL, "error": "not a batched file operation"})
            break
        answer = _answer(op)
        answers.append(answer)
        if "errno" in answer:
            break
    return {"answers": answers}


BATCHED = {"read": _read, "size": _size, "write": _write, "mkdir": _mkdir,
           "remove": _remove}
FILE_OPS = dict(BATCHED, batch=_batch, **{"await": _await})


def _answer(request):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    try:
        return FILE_OPS[request["op"]](request)
    except (KeyError, TypeError, ValueError) as exc:  # a malformed request: answered
        return {"errno": errno.EINVAL, "error": f"bad request: {exc!r}"[:200]}
    except OSError as exc:
        return {"errno": exc.errno or 0, "error": exc.strerror or str(exc)}


def one_op():
    # type: () -> None
    """One file operation, JSON in on stdin and out on stdout (commands.OneOpFiles)."""
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdout.write(json.dumps(_answer(request)) + "\n")


def main():
    # type: () -> None
    if sys.argv[1:2] == ["--one-op"]:
        one_op()
        return
    Relay(sys.stdin.buffer, sys.stdout.buffer).serve()


if __name__ == "__main__":
    main()
