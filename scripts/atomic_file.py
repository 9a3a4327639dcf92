"""Atomic file writes for gradscale's scripts: write to a temp file in the target's directory, fsync,
then rename over the target, so a reader never sees a half-written file."""
import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_open(path, mode="w"):
    """Yields a file object opened with `mode` ("w" or "wb"); on success it replaces `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
