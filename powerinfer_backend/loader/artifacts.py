"""Where files derived from a model live, and how they are written.

Artifacts are files computed from one model file: the calibration sidecar, the
transposed down-projection cache (:mod:`powerinfer_backend.engine.down_cache`), later
predictors and placement plans. They share one per-model folder:

* beside the model, ``<model_dir>/<model_stem>.powerinfer/``, when the model's
  folder is writable (and the caller does not ask otherwise), else
* the user cache, ``$XDG_CACHE_HOME/powerinfer_backend/<sha256[:16]>/``
  (``~/.cache`` when XDG_CACHE_HOME is unset, empty or relative), keyed by the
  model file's content hash. The embedded default model sits in site-packages,
  which is normally read-only, so it always takes this path.

Rules every artifact writer follows:

* the model file is only ever read, never opened for writing;
* writes are atomic (:func:`atomic_write`: a temporary file in the target
  folder, flushed and fsynced, then ``os.replace``), so a reader sees the old
  file or the new one, never a torn one, and a failed writer leaves the old
  content in place;
* each artifact records the SHA-256 of the model it came from in its metadata
  (:func:`artifact_metadata`, key ``"model_fingerprint"``). Results (a
  calibration, a plan) are not overwritten when made from another model unless
  ``force`` (:func:`check_provenance`); caches simply rebuild.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import site
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

__all__ = [
    "ARTIFACT_SUFFIX",
    "CACHE_APP_DIR",
    "FINGERPRINT_KEY",
    "model_fingerprint",
    "artifact_dir",
    "in_installed_packages",
    "cache_root",
    "atomic_write",
    "atomic_write_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "artifact_metadata",
    "metadata_path",
    "read_fingerprint",
    "read_metadata",
    "check_provenance",
]

#: Suffix of the folder beside the model: ``model.gguf`` -> ``model.powerinfer/``.
ARTIFACT_SUFFIX = ".powerinfer"
#: Folder under the user cache directory.
CACHE_APP_DIR = "powerinfer_backend"
#: Metadata key holding the model's SHA-256 (64 lowercase hex digits).
FINGERPRINT_KEY = "model_fingerprint"
#: Characters of the fingerprint naming the cache folder (64 bits).
_CACHE_KEY_LEN = 16
_CHUNK = 4 << 20  # bytes per read while hashing
# a fingerprint is stored on disk only for a file unchanged this long: a rewrite within the
# timestamp granularity (a few ms) of the hashed version would keep the same ctime
_SETTLED_NS = 2_000_000_000

_fp_lock = threading.Lock()
_fp_cache: dict[tuple[str, int, int, int, int, int], str] = {}


# ---- fingerprint -------------------------------------------------------------------


def model_fingerprint(path: str | os.PathLike) -> str:
    """SHA-256 of the file's bytes, as 64 lowercase hex digits.

    Cost: the whole file is read once (in 4 MiB chunks, constant memory),
    roughly 0.1-0.5 s per 100 MB from the page cache and disk-bound otherwise
    (about 2 s for a 1 GB model on an SSD). The result is cached in the
    process and on disk (``cache_root()/fingerprints/``, so that a new process,
    e.g. every CLI command, does not hash the file again), keyed by (real path,
    size, mtime, ctime in ns, inode, device): later calls cost a ``stat`` (and
    one small file read). Any write to the file changes its ctime, which no
    program can set back, so a changed file is hashed again; a file changed in
    the last 2 s is not stored (its ctime could still repeat).

    Raises:
        FileNotFoundError / OSError: the model file cannot be stat'ed or read
        (an unreadable or unwritable cache only costs the hash).
    """
    real = os.path.realpath(os.fspath(path))
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    with _fp_lock:
        hit = _fp_cache.get(key)
    if hit is None:
        hit = _stored_fingerprint(key)
    if hit is None:
        h = hashlib.sha256()
        with open(real, "rb") as f:  # read only: the model file is never written
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                h.update(chunk)
        hit = h.hexdigest()
        if time.time_ns() - st.st_ctime_ns > _SETTLED_NS:
            _store_fingerprint(key, hit)
    with _fp_lock:
        _fp_cache[key] = hit
    return hit


def _fingerprint_file(key: tuple) -> Path:
    name = hashlib.sha256(json.dumps(key).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return cache_root() / "fingerprints" / f"{name}.json"


def _stored_fingerprint(key: tuple) -> str | None:
    """The SHA-256 stored for ``key`` by an earlier process, if any (and well-formed)."""
    try:
        rec = json.loads(_fingerprint_file(key).read_text("utf-8"))
        digest = rec["sha256"]
        if rec["key"] == list(key) and len(digest) == 64 and int(digest, 16) >= 0:
            return digest
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _store_fingerprint(key: tuple, digest: str) -> None:
    try:
        f = _fingerprint_file(key)
        f.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(f, {"key": list(key), "sha256": digest})
    except (OSError, ValueError):  # a read-only or full cache: the next process hashes again
        pass


# ---- where ----------------------------------------------------------------------------


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/powerinfer_backend`` (``~/.cache/...`` when the variable is
    unset, empty or not absolute, as the XDG spec says). Not created here."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / CACHE_APP_DIR


def _package_roots() -> list[str]:
    roots: set[str] = set()
    for key in ("purelib", "platlib"):
        with contextlib.suppress(KeyError):
            roots.add(sysconfig.get_paths()[key])
    with contextlib.suppress(AttributeError, OSError):
        roots.update(site.getsitepackages())
    with contextlib.suppress(AttributeError, OSError):
        roots.add(site.getusersitepackages())
    return [os.path.realpath(r) for r in roots if r]


def in_installed_packages(path: str | os.PathLike) -> bool:
    """True when ``path`` lies in an installed-packages folder: under one of the
    interpreter's site-packages (sysconfig purelib/platlib, ``site``'s global and
    user folders) or below any folder named ``site-packages`` / ``dist-packages``.
    Artifacts of such models always go to the user cache."""
    real = os.path.realpath(os.fspath(path))
    parts = Path(real).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    for root in _package_roots():
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


def artifact_dir(model_path: str | os.PathLike, *, prefer_beside: bool = True, create: bool = True) -> Path:
    """The folder for artifacts derived from the model at ``model_path``.

    Beside the model, ``<model_dir>/<model_stem>.powerinfer/``, when
    ``prefer_beside``, the model is not inside an installed-packages folder
    (:func:`in_installed_packages`: the embedded model in site-packages never
    gets files written next to it, even where root could), and either that folder already exists and is writable or
    the model's folder is writable (``os.access(W_OK)``; creating it must also
    succeed). Otherwise ``cache_root() / fingerprint[:16]``, which costs one
    hash of the model file (see :func:`model_fingerprint`). Note that root
    passes ``os.access`` on any folder not on a read-only filesystem.

    Args:
        model_path: the model file (must exist).
        prefer_beside: False always uses the user cache directory.
        create: create the folder (and parents) if missing.

    Returns:
        An absolute :class:`~pathlib.Path` (existing when ``create``).

    Raises:
        FileNotFoundError: ``model_path`` is not a file.
        OSError: the cache folder cannot be created.
    """
    model = Path(os.path.realpath(os.fspath(model_path)))
    if not model.is_file():
        raise FileNotFoundError(f"Model file not found: {model_path}")
    if prefer_beside and not in_installed_packages(model):
        beside = model.parent / (model.stem + ARTIFACT_SUFFIX)
        ok = os.access(beside, os.W_OK | os.X_OK) if beside.is_dir() else os.access(model.parent, os.W_OK | os.X_OK)
        if ok:
            if not create:
                return beside
            try:
                beside.mkdir(exist_ok=True)
                return beside
            except OSError:
                pass  # e.g. a read-only filesystem access() did not report: fall back
    d = cache_root() / model_fingerprint(model)[:_CACHE_KEY_LEN]
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


# ---- atomic writes ---------------------------------------------------------------------


def atomic_write(path: str | os.PathLike, writer_fn: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` atomically: ``writer_fn(f)`` writes into a binary file object
    open on a temporary file in the same folder, which is then flushed, fsynced
    and renamed over ``path`` (``os.replace``), and the folder fsynced (best
    effort). Readers see the old file or the complete new one.

    The new file gets mode 0o644. If ``writer_fn`` (or any step) raises, the
    temporary file is removed, ``path`` keeps its old content (or stays absent)
    and the exception propagates.

    Returns:
        ``Path(path)``.

    Raises:
        Whatever ``writer_fn`` raises; OSError from the filesystem (e.g. the
        folder does not exist or is not writable).
    """

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            writer_fn(f)

    return atomic_write_path(path, write)


def atomic_write_path(path: str | os.PathLike, write_to: Callable[[Path], Any]) -> Path:
    """:func:`atomic_write` for writers that want a file name rather than a file
    object (e.g. ``gguf.GGUFWriter``): ``write_to(tmp)`` creates and closes the
    temporary file ``tmp`` (same folder); it is then fsynced and renamed over
    ``path``. Same guarantees and errors as :func:`atomic_write`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_to(Path(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> Path:
    """:func:`atomic_write` of a bytes-like object. Returns ``Path(path)``."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """:func:`atomic_write` of ``obj`` as indented, key-sorted UTF-8 JSON."""
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---- provenance --------------------------------------------------------------------------


def artifact_metadata(model_path: str | os.PathLike, **extra: Any) -> dict[str, Any]:
    """The provenance fields every artifact records, plus ``extra``:
    ``model_fingerprint`` (SHA-256 hex), ``model_path`` (absolute, as str),
    ``model_size`` (bytes) and ``created`` (Unix time, s)."""
    real = os.path.realpath(os.fspath(model_path))
    meta: dict[str, Any] = {
        FINGERPRINT_KEY: model_fingerprint(real),
        "model_path": real,
        "model_size": os.path.getsize(real),
        "created": time.time(),
    }
    meta.update(extra)
    return meta


def metadata_path(path: str | os.PathLike) -> Path:
    """Where the metadata of artifact ``path`` lives: ``path`` itself for a
    ``.json`` artifact, else the sidecar ``<path>.meta.json``."""
    p = Path(path)
    return p if p.suffix == ".json" else p.with_name(p.name + ".meta.json")


def read_metadata(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON metadata of artifact ``path`` (see :func:`metadata_path`) as a
    dict, or None when absent, unreadable or not a JSON object."""
    mp = metadata_path(path)
    try:
        with open(mp, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def read_fingerprint(path: str | os.PathLike) -> str | None:
    """The model fingerprint recorded for artifact ``path`` (see
    :func:`metadata_path`), or None when the metadata is absent, unreadable or
    has no string ``model_fingerprint``."""
    meta = read_metadata(path)
    fp = meta.get(FINGERPRINT_KEY) if meta else None
    return fp if isinstance(fp, str) else None


def check_provenance(
    path: str | os.PathLike,
    expected_fingerprint: str,
    *,
    force: bool = False,
    model_path: str | os.PathLike | None = None,
    force_hint: str = "force=True",
) -> bool:
    """Check that writing artifact ``path`` for the model with fingerprint
    ``expected_fingerprint`` will not clobber a result made from another model.

    Call before (re)writing a result artifact.

    Returns:
        True when ``path`` (and its metadata) does not exist or records the same
        fingerprint; False when it records another model (or none readable) and
        ``force`` is set: the caller may overwrite.

    Raises:
        ValueError: an existing artifact records a different model (or its
            metadata cannot be read) and not ``force``. The message names the
            artifact file, its metadata file, the model it was made from (path
            and fingerprint, as recorded), the model now in use (``model_path``
            when given, and ``expected_fingerprint``) and how to override
            (``force_hint``).
    """
    p = Path(path)
    mp = metadata_path(p)
    if not p.exists() and not mp.exists():
        return True
    meta = read_metadata(p)
    recorded = meta.get(FINGERPRINT_KEY) if meta else None
    if recorded == expected_fingerprint:
        return True
    if force:
        return False
    src = (meta or {}).get("model_path", "an unknown model")
    now = os.fspath(model_path) if model_path is not None else "the current model"
    if recorded is None:
        why = f"its metadata {mp} is missing or unreadable, so its source model is unknown"
    else:
        why = f"it was made from {src} (sha256 {recorded})"
    raise ValueError(
        f"Refusing to overwrite artifact {p}: {why}, not from {now} "
        f"(sha256 {expected_fingerprint}). Pass {force_hint} to overwrite."
    )
