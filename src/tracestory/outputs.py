"""One output boundary: every file a command writes goes through here.

Model:

* **Inputs are never overwritten.** An :class:`OutputPlan` is made once per command with
  every input it reads (files and folders). :meth:`OutputPlan.check` refuses an output path
  that names an input file or any file inside an input folder: by path (symlinks resolved)
  and by identity (``st_dev``/``st_ino``, which also catches hardlinks). An output folder that
  will be created or replaced (:meth:`OutputPlan.check_folder`) is refused when an input
  lies inside it. Two outputs of one command may not name the same file either.
* **Writes are atomic.** A file is written to a temporary name in its own folder
  (``.tmp-<random>-<name>``, so the suffix that picks a format, such as ``.gz`` or ``.png``,
  is kept) and renamed into place only when complete. A failure part-way leaves the previous
  file as it was and no partial file. Parent folders are created.
* **Special files are written in place.** An existing output that is not a regular file
  (``/dev/null``, ``/dev/full``, a FIFO) is opened and written directly: renaming over a device
  node would replace it. Errors still become one line.
* ``-`` means standard output, in every writer, also for outputs written by name
  (:func:`atomic_path`: matplotlib, gzip): the finished temporary file is copied to stdout.
  Two outputs of one command may not both be ``-``. A command that writes data to stdout
  prints its status lines on stderr (:func:`status_stream`).
* **Several outputs are all or nothing** inside :func:`all_or_nothing`: each file is written
  into a staging folder (``.tmp-<random>/``) beside its final place, and data for stdout is
  held back; only when the command's block ends without an exception are the staged files
  renamed into place, one after another, and the held data written. An exception removes the
  staging folders: no output of the set appears and the previous files stay as they were.
  :func:`staged` names where a staged output is until then (a reader of a file just written,
  such as the HTML page of the Markdown report, reads it there).
* **Write errors are one line.** Any ``OSError`` (missing or read-only folder, a folder given
  as a file, ``ENOSPC``, ``/dev/full``, ``/proc``) becomes :class:`OutputError` naming the path,
  what was expected and what was found; the CLI prints it and exits with code 2.

A folder given as an input protects every file under it (a second ``report FOLDER -o
FOLDER/report.md`` is refused too, since the first report became a file of the folder); a
command that knows which files it reads from a folder should pass those files instead.

Limits: the final renames of a set are one after another, not one atomic step (a crash or a
failing rename between two of them leaves the earlier ones renamed); folders created for the
outputs stay. Inputs are snapshotted when they are added (files created later inside an input
folder are compared by path only); the rename is atomic on one filesystem, which the
temporary name in the same folder guarantees; a crash (SIGKILL) can leave a ``.tmp-*`` file
behind, never a partial file under the output's own name (:func:`is_temporary` names them).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import IO, Iterable, Iterator

from .errors import TracestoryError

STDOUT = "-"
TEMP_PREFIX = ".tmp-"


class OutputError(TracestoryError):
    """An output that cannot be written: ``PATH: expected ..., found ...``."""

    def __init__(self, path: object, expected: str, found: str):
        self.path = str(path)
        self.expected = expected
        self.found = found
        super().__init__(f"{self.path}: expected {expected}, found {found}")

    def __reduce__(self):
        return (type(self), (self.path, self.expected, self.found))


class OutputOverwritesInput(OutputError):
    """An output path that names an input (or a file inside an input folder)."""


def is_stdout(path: object) -> bool:
    return str(path) == STDOUT


def is_temporary(name: str) -> bool:
    """Whether a file name is one of our temporary names (left behind only by a crash)."""
    return name.startswith(TEMP_PREFIX)


def _found(e: OSError) -> str:
    """An OSError as the 'found' part of a message: 'no space left on device'."""
    text = e.strerror or str(e) or type(e).__name__
    return text[0].lower() + text[1:] if text else text


def _identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


class OutputPlan:
    """The inputs of one command, against which every output is checked once.

    >>> plan = OutputPlan(inputs=["trace.json.gz", "ranks/"])
    >>> plan.check("report.md")          # a Path, or None for "-"
    >>> plan.write_text("report.md", text)
    """

    def __init__(self, inputs: Iterable[str | os.PathLike] = ()):
        self._files: dict[tuple[int, int], str] = {}   # identity -> input as given
        self._paths: dict[str, str] = {}               # resolved path -> input as given
        self._folders: list[tuple[str, str]] = []      # (resolved folder, input as given)
        self._claimed: dict[str, str] = {}             # resolved output -> what claimed it
        for p in inputs:
            self.add_input(p)

    def add_input(self, path: str | os.PathLike) -> None:
        """Add an input file or folder (every file under a folder counts as an input)."""
        if is_stdout(path):
            return
        given = str(path)
        real = os.path.realpath(given)
        self._paths[real] = given
        try:
            st = os.stat(real)
        except OSError:
            return                      # a missing input is the reader's error, not ours
        if stat.S_ISDIR(st.st_mode):
            self._folders.append((real, given))
            for root, _dirs, files in os.walk(real):
                for f in files:
                    member = os.path.join(root, f)
                    shown = os.path.join(given, os.path.relpath(member, real))
                    with contextlib.suppress(OSError):
                        self._files[_identity(os.stat(member))] = f"{shown} (in the input folder {given})"
        elif stat.S_ISREG(st.st_mode):
            self._files[_identity(st)] = given

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self._paths.values()))

    def _input_named_by(self, path: str) -> str | None:
        real = os.path.realpath(path)
        if real in self._paths:
            return self._paths[real]
        try:
            st = os.stat(real)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and _identity(st) in self._files:
            return self._files[_identity(st)]
        for folder, given in self._folders:   # created after the plan was made
            if real.startswith(folder.rstrip(os.sep) + os.sep) and os.path.isfile(real):
                return f"{os.path.join(given, os.path.relpath(real, folder))} (in the input folder {given})"
        return None

    def check(self, path: str | os.PathLike, what: str = "output") -> Path | None:
        """Refuse ``path`` in one line if writing it would overwrite an input, if it is a
        folder, an empty name or a folder path (``out/``), or if another output of this command claimed it (``what`` names the output:
        two outputs with different ``what`` may not name one file, and only one may be ``-``).
        ``-`` gives None."""
        if is_stdout(path):
            other = self._claimed.get(STDOUT)
            if other is not None and other != what:
                raise OutputError(STDOUT, f"standard output for one output only ({what})",
                                  f"the {other} there too (give one of them a file)")
            self._claimed[STDOUT] = what
            return None
        text = os.fspath(path)
        if not text:
            raise OutputError(f"{what} ''", f"a file path for the {what}", "an empty name")
        if text.endswith(("/", os.sep)):   # a folder path: writing the file "out" for "out/" is a guess
            raise OutputError(text, f"a file path for the {what}", "a folder path (it ends with '/')")
        p = Path(path)
        hit = self._input_named_by(str(p))
        if hit is not None:
            raise OutputOverwritesInput(os.fspath(path), f"a path for the {what} that is not an input",
                                        f"the input {hit}")
        if p.is_dir():
            raise OutputError(p, f"a file path for the {what}", "a folder")
        real = os.path.realpath(p)
        other = self._claimed.get(real)
        if other is not None and other != what:
            raise OutputError(p, f"one file per output ({what})", f"the same file as the {other}")
        self._claimed[real] = what
        return p

    def check_folder(self, folder: str | os.PathLike, what: str = "output folder") -> Path:
        """Refuse a folder that will be created or replaced when an input lies inside it
        (or is it)."""
        real = os.path.realpath(folder).rstrip(os.sep) + os.sep
        for inp_real, given in self._paths.items():
            if (inp_real + os.sep).startswith(real):
                raise OutputOverwritesInput(folder, f"no input inside the {what}",
                                            f"the input {given} inside it")
        return Path(folder)

    def write_text(self, path: str | os.PathLike, text: str, what: str = "output",
                   encoding: str = "utf-8") -> Path | None:
        self.check(path, what)
        return write_text(path, text, encoding=encoding)

    def write_bytes(self, path: str | os.PathLike, data: bytes, what: str = "output") -> Path | None:
        self.check(path, what)
        return write_bytes(path, data)

    @contextlib.contextmanager
    def atomic_path(self, path: str | os.PathLike, what: str = "output") -> Iterator[Path]:
        self.check(path, what)
        with atomic_path(path) as tmp:
            yield tmp

    @contextlib.contextmanager
    def open(self, path: str | os.PathLike, mode: str = "w", what: str = "output",
             encoding: str | None = "utf-8") -> Iterator[IO]:
        self.check(path, what)
        with open_output(path, mode, encoding=encoding) as fh:
            yield fh


class _Staging:
    """The outputs of one :func:`all_or_nothing` block: staged files and held stdout data."""

    def __init__(self):
        self.folders: dict[str, Path] = {}     # resolved output folder -> its staging folder
        self.files: dict[str, Path] = {}       # resolved final path -> staged path (in order)
        self.stdout: list[bytes] = []

    def path_for(self, p: Path) -> Path:
        final = os.path.realpath(p)
        parent = os.path.dirname(final)
        stage = self.folders.get(parent)
        if stage is None:
            try:
                stage = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent))
            except OSError as e:
                raise OutputError(p, "a writable output folder", _found(e)) from None
            self.folders[parent] = stage
        staged_path = stage / os.path.basename(final)
        self.files[final] = staged_path
        return staged_path

    def commit(self) -> None:
        for final, staged_path in self.files.items():
            if not staged_path.exists():
                continue          # a write that failed inside a caught error
            try:
                _keep_mode(Path(final), staged_path)
                os.replace(staged_path, final)
            except OSError as e:
                raise OutputError(final, "a writable output file", _found(e)) from None
        data = b"".join(self.stdout)
        if data:
            _write_stdout(data)

    def remove(self) -> None:
        for stage in self.folders.values():
            shutil.rmtree(stage, ignore_errors=True)


_staging: _Staging | None = None


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """Every output written inside the block appears only when the block ends without an
    exception (see the module docstring); nested blocks belong to the outermost one."""
    global _staging
    if _staging is not None:
        yield
        return
    _staging = stage = _Staging()
    try:
        yield
        _staging = None
        stage.commit()
    finally:
        _staging = None
        stage.remove()


def staged(path: str | os.PathLike) -> Path:
    """Where the content of output ``path`` is now: its staged file inside an
    :func:`all_or_nothing` block, else ``path`` itself."""
    if _staging is not None:
        hit = _staging.files.get(os.path.realpath(path))
        if hit is not None:
            return hit
    return Path(path)


_data_stdout: IO | None = None


@contextlib.contextmanager
def prints_to_stderr(active: bool = True) -> Iterator[None]:
    """Inside the block (when ``active``), ``print`` goes to stderr while the outputs named
    ``-`` still go to the real stdout: a command whose data goes to stdout keeps its status
    text (tables, progress, "wrote FILE") off it."""
    global _data_stdout
    if not active or _data_stdout is not None:
        yield
        return
    _data_stdout = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _data_stdout = None


def _stdout() -> IO:
    return _data_stdout if _data_stdout is not None else sys.stdout


def open_stream(path: str | os.PathLike) -> IO:
    """A text file written as the data comes (a live record stream, not atomic: its lines
    are what was known when it stopped); ``-`` gives stdout, which the caller must not close.
    An OSError becomes one line."""
    if is_stdout(path):
        return _stdout()
    try:
        return open(path, "w", encoding="utf-8")  # noqa: SIM115  (the caller closes it)
    except OSError as e:
        raise OutputError(path, "a writable output file", _found(e)) from None


def status_stream(*outs) -> IO:
    """Where a command prints its status lines ("wrote FILE"): stderr when any of ``outs`` is
    ``-`` (stdout then carries data only), else stdout."""
    return sys.stderr if any(o is not None and is_stdout(o) for o in outs) else sys.stdout


def ensure_folder(folder: str | os.PathLike) -> Path:
    """Create ``folder`` and its parents; an OSError becomes one line."""
    p = Path(folder)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(p, "a folder", "a file") from None
    except OSError as e:
        raise OutputError(e.filename or p, "a folder that can be created", _found(e)) from None
    return p


def _special(p: Path) -> bool:
    """An existing output that is not a regular file or folder (a device, a FIFO)."""
    try:
        st = os.stat(p)
    except OSError:
        return False
    return not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path in the folder of ``path`` to write (by name: matplotlib, gzip,
    torch); renamed onto ``path`` when the block ends without an exception, removed
    otherwise. An OSError inside the block or from the rename becomes :class:`OutputError`.
    For a special file (``/dev/null``) the block gets ``path`` itself; for ``-`` a temporary
    file whose bytes go to stdout when the block ends."""
    if is_stdout(path):
        with _stdout_path() as tmp:
            yield tmp
        return
    p = Path(path)
    if p.is_dir():
        raise OutputError(p, "a file path", "a folder")
    if _special(p):
        try:
            yield p
        except OSError as e:
            raise OutputError(p, "a writable output file", _found(e)) from None
        return
    ensure_folder(p.parent if str(p.parent) else Path("."))
    if _staging is not None:
        tmp = _staging.path_for(p)
        with _removed_on_error(tmp, p):
            yield tmp
        return
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix="-" + p.name, dir=p.parent)
        os.close(fd)
    except OSError as e:
        raise OutputError(p, "a writable output file", _found(e)) from None
    tmp = Path(tmp_name)
    # tempfile names are ".tmp-XXXX-<name>": same folder, same suffixes as the output
    with _removed_on_error(tmp, p):
        yield tmp
        _keep_mode(p, tmp)
        os.replace(tmp, p)


@contextlib.contextmanager
def _removed_on_error(tmp: Path, p: Path) -> Iterator[None]:
    """``tmp`` removed when the block fails; an OSError becomes :class:`OutputError` naming ``p``."""
    try:
        yield
    except OSError as e:
        _remove(tmp)
        raise OutputError(p, "a writable output file", _found(e)) from None
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def _stdout_path() -> Iterator[Path]:
    """A temporary file for an output named ``-``; its bytes are written to stdout at the end."""
    fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _write_stdout(tmp.read_bytes())
    finally:
        _remove(tmp)


def _write_stdout(data: bytes) -> None:
    if _staging is not None:
        _staging.stdout.append(data)
        return
    out = _stdout()
    try:
        out.flush()
        out.buffer.write(data)
        out.buffer.flush()
    except OSError as e:
        raise OutputError("<stdout>", "a writable standard output", _found(e)) from None


def _keep_mode(p: Path, tmp: Path) -> None:
    """mkstemp creates 0600; give the file the mode a plain open() would (or the old file's)."""
    try:
        mode = stat.S_IMODE(os.stat(p).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    with contextlib.suppress(OSError):
        os.chmod(tmp, mode)


def _remove(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


@contextlib.contextmanager
def open_output(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """An open file that becomes ``path`` atomically when the block ends (``-``: stdout)."""
    binary = "b" in mode
    if is_stdout(path) and _staging is not None:
        buf = io.BytesIO() if binary else io.StringIO()
        yield buf
        value = buf.getvalue()
        _staging.stdout.append(value if binary else value.encode(encoding or "utf-8"))
        return
    if is_stdout(path):
        fh = _stdout().buffer if binary else _stdout()
        try:
            yield fh
            fh.flush()
        except OSError as e:
            raise OutputError("<stdout>", "a writable standard output", _found(e)) from None
        return
    with atomic_path(path) as tmp:
        special = tmp == Path(path)
        kw = {} if binary else {"encoding": encoding}
        with open(tmp, mode if special else mode.replace("a", "w"), **kw) as fh:
            yield fh


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path | None:
    """Write ``text`` to ``path`` atomically (``-``: stdout); the path, or None for stdout."""
    with open_output(path, "w", encoding=encoding) as fh:
        fh.write(text)
    return None if is_stdout(path) else Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path | None:
    """Write ``data`` to ``path`` atomically (``-``: stdout)."""
    with open_output(path, "wb") as fh:
        fh.write(data)
    return None if is_stdout(path) else Path(path)


__all__ = ["STDOUT", "OutputError", "OutputOverwritesInput", "OutputPlan", "all_or_nothing", "atomic_path",
           "ensure_folder", "is_stdout", "is_temporary", "open_output", "open_stream", "prints_to_stderr", "staged", "status_stream", "write_bytes",
           "write_text"]
