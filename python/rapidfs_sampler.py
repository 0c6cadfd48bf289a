"""Send each epoch's file order to a rapidfs mount so it prefetches the files before they are read.

One line to adopt, with any PyTorch sampler::

    from rapidfs_sampler import RapidfsSampler
    loader = DataLoader(ds, sampler=RapidfsSampler(RandomSampler(ds), paths, "/mnt/data"))

At each epoch's ``__iter__`` the wrapper draws every index of ``base_sampler``, sends the
matching paths in that order as a hint over the mount's control socket, and yields the same
indices. rapidfs then keeps a window of the next files in flight as the workers open them.
Standard library only (socket, json, os); a missing socket (not a rapidfs mount, an older
daemon) costs one warning, and the indices are yielded all the same.
"""

import json
import os
import stat
import socket
import warnings

__all__ = ["RapidfsSampler", "socket_path"]

SOCKET_ENV = "RAPIDFS_CONTROL_SOCKET"
_MAX_ESCAPED = 64
_SAFE = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")


def _socket_name(mountpoint):
    """The socket file name of an absolute mountpoint, as rapidfs computes it
    (``rapidfs::control::socket_name``: systemd-escape --path, hashed when long)."""
    raw = os.fsencode(mountpoint)
    trimmed = raw.strip(b"/")
    out = "-" if not trimmed else ""
    for n, b in enumerate(trimmed):
        if b == ord("/"):
            out += "-"
        elif b == ord(".") and n == 0:
            out += "\\x2e"
        elif b in _SAFE:
            out += chr(b)
        else:
            out += "\\x%02x" % b
    if len(out) > _MAX_ESCAPED:
        h = 0xCBF29CE484222325
        for b in raw:
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        out = "%s-%016x" % (out[-40:], h)
    return out + ".sock"


def _socket_dirs():
    dirs = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        dirs.append(os.path.join(xdg, "rapidfs"))
    uid = os.getuid()
    dirs.append("/run/rapidfs" if uid == 0 else "/tmp/rapidfs-%d" % uid)
    return dirs


def socket_path(mountpoint):
    """The control socket of the rapidfs mount on ``mountpoint``: ``$RAPIDFS_CONTROL_SOCKET``
    when set, else the first candidate that exists (else the preferred one)."""
    explicit = os.environ.get(SOCKET_ENV)
    if explicit:
        return explicit
    name = _socket_name(os.path.realpath(mountpoint))
    candidates = [os.path.join(d, name) for d in _socket_dirs()]
    for c in candidates:
        if _private(os.path.dirname(c)) and os.path.exists(c):
            return c
    return candidates[0]


def _private(directory):
    """Whether only this user can write ``directory``: a socket another user put in a /tmp
    directory of our name is not the mount's."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


class RapidfsSampler:
    """Wraps ``base_sampler`` (any iterable of dataset indices); ``paths[i]`` is the file of
    index ``i``, absolute under ``mountpoint`` or relative to it."""

    def __init__(self, base_sampler, paths, mountpoint, timeout=10.0):
        self.base_sampler = base_sampler
        self.mountpoint = os.path.realpath(os.fspath(mountpoint))
        self.paths = [self._relative(os.fspath(p)) for p in paths]
        self.timeout = timeout
        self._sock = None
        self._reader = None
        self._warned = False

    def _relative(self, p):
        if os.path.isabs(p):
            real = os.path.normpath(p)
            root = self.mountpoint.rstrip("/") + "/"
            if real.startswith(root):
                return real[len(root):]
            return None
        return p

    def __len__(self):
        return len(self.base_sampler)

    def set_epoch(self, epoch):
        """Passed on to the wrapped sampler (DistributedSampler reshuffles with it)."""
        if hasattr(self.base_sampler, "set_epoch"):
            self.base_sampler.set_epoch(epoch)

    def __iter__(self):
        indices = list(iter(self.base_sampler))
        order = [self.paths[i] for i in indices]
        self._hint([p for p in order if p is not None])
        return iter(indices)

    def _warn(self, why):
        if not self._warned:
            self._warned = True
            warnings.warn("rapidfs_sampler: no prefetch hints (%s)" % why, RuntimeWarning, stacklevel=3)

    def _connect(self):
        path = socket_path(self.mountpoint)
        if not os.environ.get(SOCKET_ENV) and not _private(os.path.dirname(path)):
            raise OSError("%s: not in a directory only this user can write" % path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(path)
        except OSError as e:
            s.close()
            raise OSError("%s: %s" % (path, e)) from e
        self._sock = s
        self._reader = s.makefile("rb")

    def _close(self):
        for f in (self._reader, self._sock):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        self._sock = self._reader = None

    def _hint(self, rels):
        line = (json.dumps({"op": "hint", "paths": rels}) + "\n").encode()
        # One retry on a fresh connection: the daemon may have been restarted since.
        for attempt in range(2):
            try:
                if self._sock is None:
                    self._connect()
                self._sock.sendall(line)
                reply = self._reader.readline()
                if not reply:
                    raise OSError("the mount closed the control connection")
                answer = json.loads(reply)
                if "error" in answer:
                    self._warn(answer["error"])
                return
            except (OSError, ValueError) as e:
                self._close()
                if attempt == 1:
                    self._warn(e)

    def __getstate__(self):
        # The connection stays with the process that opened it (hints last as long as it).
        state = self.__dict__.copy()
        state["_sock"] = None
        state["_reader"] = None
        return state

    def __del__(self):
        self._close()
