"""The all-or-nothing output directory: interrupted (KeyboardInterrupt) at every step of a staging, of a replacement
and of the next run's cleanup, the output is the complete previous or the complete new directory and the next run
tidies up; a previous output that cannot be deleted is reported and never restored; a full disk or an unwritable
parent is one OutputDirError naming the output directory, with the data left intact."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import SafetensorError

from fixtures import default_signals

from lightprune.checkpoints import OutputDirError, staging, staging_dir, staging_names
from lightprune.checkpoints.staging import check_out_dir, check_out_file, clean_stale, staging_file
from lightprune.checkpoints.staging_names import TMP_TAG

OLD = {"weights.bin": "old weights", "sub/config.json": "old config"}
NEW = {"weights.bin": "new weights", "sub/config.json": "new config"}
THIRD = {"weights.bin": "third weights"}
#: a pid above every system's pid_max (Linux allows at most 2**22): no process has it
DEAD_PID = 2**22 + 1
needs_permission_bits = pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")


def write(folder: Path, files: dict[str, str]) -> None:
    """``files`` written under ``folder``, a file before every subdirectory (a partial tree differs from a whole
    one)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (folder / rel).parent.mkdir(exist_ok=True)
        (folder / rel).write_text(text)


def tree(folder: Path) -> dict[str, str] | None:
    """{relative path: text} of every file under ``folder``; None when it does not exist."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def listing(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def leftovers(parent: Path, kind: str = "") -> list[Path]:
    return sorted(p for p in parent.iterdir() if f".lightprune-{kind}" in p.name)


def as_dead(parent: Path) -> None:
    """This process's leftovers renamed to a pid that no process has, as if it had died."""
    assert not staging.process_alive(DEAD_PID)
    mine = f"-{os.getpid()}-"
    for path in leftovers(parent):
        if mine in path.name:
            os.rename(path, path.with_name(path.name.replace(mine, f"-{DEAD_PID}-")))


def leftover(out: Path, kind: str) -> Path:
    """A leftover of a dead process: ``kind`` is tmp, old or trash."""
    return out.parent / f".{out.name}.lightprune-{kind}-{DEAD_PID}-{os.urandom(6).hex()}"


class Interrupt:
    """KeyboardInterrupt at the ``at``-th call of os.rename, os.mkdir and shutil.rmtree (counted together):
    ``before`` the call runs, ``after`` it ran, or ``midway`` (in an rmtree: one file deleted, the rest kept;
    other calls: before)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int, when: str) -> None:
        self.at, self.when, self.calls, self.fired = at, when, 0, None
        for module, name in ((os, "rename"), (os, "mkdir"), (shutil, "rmtree")):
            monkeypatch.setattr(module, name, self._wrapped(name, getattr(module, name)))

    def _wrapped(self, name, real):
        def call(*args, **kwargs):
            self.calls += 1
            if self.calls != self.at:
                return real(*args, **kwargs)
            paths = [os.path.basename(os.fspath(arg)) for arg in args if isinstance(arg, (str, os.PathLike))]
            self.fired = f"call {self.at}: {name}({', '.join(paths)}) interrupted {self.when}"
            if self.when == "after":
                try:
                    real(*args, **kwargs)
                except OSError:  # the call failed (an existing directory), then the interrupt came
                    pass
            elif self.when == "midway" and name == "rmtree":
                files = sorted(p for p in Path(args[0]).rglob("*") if p.is_file())
                if files:
                    files[0].unlink()
            raise KeyboardInterrupt
        return call


def interrupted(monkeypatch: pytest.MonkeyPatch, at: int, when: str, run) -> str | None:
    """``run()`` interrupted at call ``at``; what was interrupted, None when ``run`` made fewer calls."""
    with monkeypatch.context() as patched:
        interrupt = Interrupt(patched, at, when)
        try:
            run()
        except KeyboardInterrupt:
            assert interrupt.fired is not None
    return interrupt.fired


def export(out: Path, files: dict[str, str], overwrite: bool = True) -> None:
    with staging_dir(out, overwrite=overwrite) as staged:
        assert listing(staged) == []
        write(staged, files)


# ------------------------------------------------------------------------------------------ interrupts
@pytest.mark.parametrize("previous", [OLD, None], ids=["replacing", "creating"])
@pytest.mark.parametrize("when", ["before", "after", "midway"])
def test_an_interrupted_export_leaves_the_previous_or_the_new_output_and_the_next_run_tidies_up(
        tmp_path, monkeypatch, when, previous):
    for at in itertools.count(1):
        root = tmp_path / str(at)
        out = root / "model"
        if previous is not None:
            write(out, previous)
        else:
            root.mkdir()
        step = interrupted(monkeypatch, at, when, lambda out=out: export(out, NEW))
        if step is None:  # every call has been interrupted once; uninterrupted, the new output is in place
            assert tree(out) == NEW and listing(root) == ["model"]
            break
        assert tree(out) in (previous, NEW), step  # never a partial staging, never nothing
        for old in leftovers(root, "old"):
            assert tree(old) == previous, step  # a set-aside copy is complete
        assert not leftovers(root, "tmp"), step

        as_dead(root)
        deleted = tmp_path / f"{at}-deleted"  # the same state, then the user deletes the output
        shutil.copytree(root, deleted, symlinks=True)
        shutil.rmtree(deleted / "model", ignore_errors=True)
        clean_stale(deleted / "model")
        assert tree(deleted / "model") in (None, previous), step  # no staging, no half-deleted copy comes back
        assert listing(deleted) in ([], ["model"]), step

        export(out, THIRD)  # the next run
        assert tree(out) == THIRD and listing(root) == ["model"], step
    # setup, staging, body and (replacing) both renames, trash rename, deletion were each interrupted
    assert at > (7 if previous is not None else 4)


@pytest.mark.parametrize("target", ["missing", "present"])
@pytest.mark.parametrize("when", ["before", "after", "midway"])
def test_an_interrupted_cleanup_never_restores_a_partial_directory(tmp_path, monkeypatch, when, target):
    for at in itertools.count(1):
        out = tmp_path / str(at) / "model"
        out.parent.mkdir()
        if target == "present":
            write(out, NEW)
        write(leftover(out, "tmp"), {"weights.bin": "staged, unfinished"})
        write(leftover(out, "old"), OLD)  # killed between the two renames of a replacement
        write(leftover(out, "trash"), {"sub/config.json": "old config"})  # killed while deleting
        step = interrupted(monkeypatch, at, when, lambda out=out: clean_stale(out))
        expected = NEW if target == "present" else OLD
        assert tree(out) in ((None, OLD) if target == "missing" else (NEW,)), step
        if tree(out) is None:
            assert [tree(p) for p in leftovers(out.parent, "old")] == [OLD], step  # still complete, still there
        for old in leftovers(out.parent, "old"):
            assert tree(old) == OLD, step
        if target == "present":
            deleted = out.parent.with_name(f"{at}-deleted")
            shutil.copytree(out.parent, deleted, symlinks=True)
            shutil.rmtree(deleted / "model")
            clean_stale(deleted / "model")
            assert tree(deleted / "model") in (None, OLD), step
        clean_stale(out)  # the run after
        assert tree(out) == expected and listing(out.parent) == ["model"], step
        if step is None:
            break
    assert at > (4 if target == "present" else 3)  # each rename and deletion was interrupted


def test_leftovers_of_a_live_process_are_left_alone(tmp_path):
    out = tmp_path / "model"
    write(out, NEW)
    alive = out.parent / f".model.lightprune-old-{os.getppid()}-{os.urandom(6).hex()}"
    write(alive, OLD)
    assert clean_stale(out) == [] and tree(alive) == OLD


# ------------------------------------------------------------------------- a previous output stuck on disk
@pytest.mark.parametrize("how", ["read-only subdirectory", "unlink refused"])
def test_a_previous_output_that_cannot_be_deleted_is_reported_and_never_restored(tmp_path, monkeypatch, how):
    if how == "read-only subdirectory" and os.geteuid() == 0:
        pytest.skip("root ignores permission bits")
    out = tmp_path / "model"
    write(out, {**OLD, "stuck/held.bin": "old, undeletable"})
    with monkeypatch.context() as patched:
        if how == "read-only subdirectory":
            (out / "stuck").chmod(0o500)
        else:
            real_unlink = os.unlink

            def unlink(path, *args, **kwargs):
                if os.path.basename(os.fspath(path)) == "held.bin":
                    raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
                return real_unlink(path, *args, **kwargs)

            patched.setattr(os, "unlink", unlink)
        try:
            with pytest.warns(RuntimeWarning) as warned:
                export(out, NEW)
            assert tree(out) == NEW  # the export succeeded
            [trash] = leftovers(tmp_path)
            assert ".model.lightprune-trash-" in trash.name and (trash / "stuck" / "held.bin").exists()
            [message] = [str(w.message) for w in warned]
            assert repr(str(trash)) in message and "delete it by hand" in message

            shutil.rmtree(out)  # the user deletes the new output; the process that left the trash is gone
            as_dead(tmp_path)
            [trash] = leftovers(tmp_path)
            with pytest.warns(RuntimeWarning, match="delete it by hand"):
                assert clean_stale(out) == []  # tried again, still stuck, reported again
            assert not out.exists() and leftovers(tmp_path) == [trash]  # never put back in place
        finally:
            for folder in tmp_path.iterdir():
                if (folder / "stuck").is_dir():
                    (folder / "stuck").chmod(0o700)
    assert clean_stale(out) == [trash] and listing(tmp_path) == []  # deletable again: the next run deletes it


# ------------------------------------------------------------------------------------------ disk errors
NO_SPACE = {
    "ENOSPC": lambda staged: OSError(errno.ENOSPC, "No space left on device", str(staged / "model.safetensors")),
    "safetensors StorageFull": lambda staged: SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
    "safetensors os error 28": lambda staged: SafetensorError("I/O error: No space left on device (os error 28)"),
}


@pytest.mark.parametrize("previous", [OLD, None], ids=["replacing", "creating"])
@pytest.mark.parametrize("error", list(NO_SPACE), ids=list(NO_SPACE))
def test_a_full_disk_is_one_error_naming_the_output_and_leaves_the_data_intact(tmp_path, error, previous):
    out = tmp_path / "model"
    if previous is not None:
        write(out, previous)
    with pytest.raises(OutputDirError) as raised, staging_dir(out, overwrite=True) as staged:
        write(staged, NEW)
        original = NO_SPACE[error](staged)
        raise original
    message = str(raised.value)
    kept = "is as it was" if previous is not None else "was not created"
    assert message == f"no space left on the device holding {str(out)!r}; nothing was written, {str(out)!r} {kept}"
    assert raised.value.__cause__ is original and raised.value.errno == errno.ENOSPC
    assert isinstance(raised.value, OSError)
    assert tree(out) == previous and listing(tmp_path) == (["model"] if previous is not None else [])


def test_an_exceeded_quota_is_named_as_such(tmp_path):
    out = tmp_path / "model"
    quota = "^disk quota exceeded on the device holding " + re.escape(repr(str(out)))
    with pytest.raises(OutputDirError, match=quota), staging_dir(out) as staged:
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(staged / "a"))
    assert listing(tmp_path) == []


@pytest.mark.parametrize("error", [RuntimeError("a bug"), OSError(errno.EIO, "Input/output error", "x"),
                                   SafetensorError("header too large")], ids=["bug", "EIO", "other safetensors"])
def test_other_errors_in_the_block_pass_unchanged(tmp_path, error):
    out = tmp_path / "model"
    write(out, OLD)
    with pytest.raises(type(error)) as raised, staging_dir(out, overwrite=True) as staged:
        write(staged, NEW)
        raise error
    assert raised.value is error and tree(out) == OLD and listing(tmp_path) == ["model"]


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.EPERM])
def test_an_unwritable_parent_is_one_error_naming_it_and_the_output(tmp_path, monkeypatch, code):
    out = tmp_path / "model"
    write(out, OLD)
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if TMP_TAG in os.fspath(path):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(OutputDirError) as raised:
        export(out, NEW)
    assert str(raised.value) == (f"cannot write to {str(tmp_path)!r}: {os.strerror(code).lower()}; nothing was "
                                 f"written, {str(out)!r} is as it was")
    assert raised.value.errno == code and raised.value.__cause__.errno == code
    assert tree(out) == OLD and listing(tmp_path) == ["model"]


@needs_permission_bits
def test_a_read_only_parent_is_one_error_naming_it(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o500)
    out = parent / "missing" / "model"
    try:
        with pytest.raises(OutputDirError) as raised:
            export(out, NEW)
    finally:
        parent.chmod(0o700)
    assert str(raised.value) == (f"cannot write to {str(parent)!r}: permission denied; nothing was written, "
                                 f"{str(out)!r} was not created")
    assert isinstance(raised.value.__cause__, PermissionError) and listing(parent) == []


def test_the_command_reports_an_output_dir_error_in_one_line(tmp_path, monkeypatch, capsys):
    from lightprune.cli import app as cli
    from lightprune.core.errors import ERRORS

    assert OutputDirError in ERRORS and "OutputDirError" in staging.__all__

    def full_disk():
        with staging_dir(tmp_path / "model") as staged:
            raise OSError(errno.ENOSPC, "No space left on device", str(staged / "model.safetensors"))

    monkeypatch.setattr(cli, "cli_main", full_disk)
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    assert capsys.readouterr().err == (f"lightprune: error: no space left on the device holding "
                                       f"{str(tmp_path / 'model')!r}; nothing was written, "
                                       f"{str(tmp_path / 'model')!r} was not created\n")


#: write errors of a file in the staged directory, and the line each becomes (``{out}``, ``{folder}``: the staged
#: file's folder, ``{kept}``)
WRITE_ERRORS = {
    "EFBIG": (lambda staged: OSError(errno.EFBIG, "File too large"),
              "file too large for the device holding {out} (the file size limit: `ulimit -f`, or the file system's "
              "largest file); {kept}"),
    "safetensors EFBIG": (lambda staged: SafetensorError("Error while serializing: I/O error: File too large (os "
                                                         "error 27)"),
                          "file too large for the device holding {out} (the file size limit: `ulimit -f`, or the "
                          "file system's largest file); {kept}"),
    "EROFS": (lambda staged: OSError(errno.EROFS, "Read-only file system", str(staged / "sub" / "config.json")),
              "cannot write to {folder}: read-only file system; {kept}"),
    "EACCES": (lambda staged: PermissionError(errno.EACCES, "Permission denied", str(staged / "sub" / "config.json")),
               "cannot write to {folder}: permission denied; {kept}"),
    "safetensors EROFS": (lambda staged: SafetensorError("I/O error: Read-only file system (os error 30)"),
                          "cannot write to {parent}: read-only file system; {kept}"),
    "safetensors EDQUOT": (lambda staged: SafetensorError("I/O error: Disk quota exceeded (os error 122)"),
                           "disk quota exceeded on the device holding {out}; {kept}"),
}


@pytest.mark.parametrize("previous", [OLD, None], ids=["replacing", "creating"])
@pytest.mark.parametrize("error", list(WRITE_ERRORS), ids=list(WRITE_ERRORS))
def test_a_write_error_in_the_output_is_one_error_naming_it_and_leaves_the_data_intact(tmp_path, error, previous):
    out = tmp_path / "model"
    if previous is not None:
        write(out, previous)
    make, expected = WRITE_ERRORS[error]
    with pytest.raises(OutputDirError) as raised, staging_dir(out, overwrite=True) as staged:
        write(staged, NEW)
        original = make(staged)
        raise original
    kept = f"nothing was written, {str(out)!r} " + ("is as it was" if previous is not None else "was not created")
    assert str(raised.value) == expected.format(out=repr(str(out)), folder=repr(str(staged / "sub")),
                                                parent=repr(str(tmp_path)), kept=kept)
    assert raised.value.__cause__ is original and raised.value.errno is not None
    assert tree(out) == previous and listing(tmp_path) == (["model"] if previous is not None else [])


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EISDIR, errno.ELOOP])
def test_an_input_the_block_cannot_read_is_one_line_naming_it(tmp_path, code):
    out, source = tmp_path / "model", tmp_path / "source" / "tokenizer.json"
    write(out, OLD)
    original = OSError(code, os.strerror(code), str(source))
    with pytest.raises(OSError) as raised, staging_dir(out, overwrite=True) as staged:
        write(staged, NEW)
        raise original
    assert type(raised.value) is type(original) and raised.value.errno == code
    assert str(raised.value).startswith(f"cannot read {str(source)!r}: {os.strerror(code).lower()}; ")
    assert str(raised.value).endswith(f"; nothing was written, {str(out)!r} is as it was")
    assert raised.value.__cause__ is original and tree(out) == OLD and listing(tmp_path) == ["model"]


NOT_UTF8 = os.fsdecode(b"out\xff")


def test_an_output_named_with_bytes_that_are_not_utf8_is_refused_up_front(tmp_path):
    out = tmp_path / NOT_UTF8
    line = f"{str(out)!r} is not UTF-8 text (byte 0xff): lightprune records paths in JSON; rename it"
    for check in (check_out_dir, staging_dir):
        with pytest.raises(ValueError) as raised:
            with check(out) if check is staging_dir else contextlib.nullcontext(check(out)):
                pass
        assert str(raised.value) == f"output directory {line}"
    for check in (check_out_file, staging_file):
        with pytest.raises(ValueError) as raised:
            with check(out) if check is staging_file else contextlib.nullcontext(check(out)):
                pass
        assert str(raised.value) == f"output file {line}"
    assert listing(tmp_path) == []


# ------------------------------------------------------------------------------------------ SIGTERM
_TERMINATED = """
import os, sys, time
from pathlib import Path
from lightprune.checkpoints.staging import {staging}
with {staging}(Path(sys.argv[1])) as staged:
    (staged / "weights.bin" if staged.is_dir() else staged).write_text("partial")
    print("staged", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("staging, signum", [("staging_dir", signal.SIGTERM), ("staging_file", signal.SIGTERM),
                                             ("staging_dir", signal.SIGHUP)], ids=["dir", "file", "dir-sighup"])
def test_a_script_killed_by_sigterm_removes_what_it_staged_and_ends_as_sigterm_ends_it(tmp_path, staging, signum):
    """SIGTERM, or SIGHUP (the terminal closed), to a script while it stages: what it staged is removed, then the
    process ends as that signal ends it."""
    out = tmp_path / "model"
    child = subprocess.Popen([sys.executable, "-c", _TERMINATED.format(staging=staging), str(out)],
                             stdout=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        assert child.stdout.readline() == "staged\n"
        assert len(listing(tmp_path)) == 1  # the staged directory or file
        child.send_signal(signum)
        assert child.wait(timeout=60) == -signum
    finally:
        child.kill()
        child.wait()
    assert listing(tmp_path) == []


def test_sigterm_is_left_to_a_handler_of_the_callers_own_and_restored_after_the_block(tmp_path):
    def own(signum, frame):
        raise AssertionError("not called")

    default = signal.getsignal(signal.SIGTERM)
    try:
        with staging_dir(tmp_path / "a"):  # the default action: a handler of the block's own, for the block only
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, own)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        signal.signal(signal.SIGTERM, own)
        with staging_dir(tmp_path / "b"), staging_file(tmp_path / "c"):
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, default)
    assert sorted(listing(tmp_path)) == ["a", "b", "c"]


def test_a_staged_file_a_dead_process_left_is_removed_by_the_next_staging_of_its_target(tmp_path):
    """A kill during a staging_file leaves its hidden file; the next staging_file of the same target deletes it (a
    live process's, this one's, is left)."""
    dead = tmp_path / f".model.gguf{TMP_TAG}{DEAD_PID}-0123456789ab"
    live = tmp_path / f".model.gguf{TMP_TAG}{os.getpid()}-0123456789ab"
    other = tmp_path / f".other.gguf{TMP_TAG}{DEAD_PID}-0123456789ab"
    for path in (dead, live, other):
        path.write_bytes(b"partial")
    with staging_file(tmp_path / "model.gguf") as staged:
        staged.write_bytes(b"GGUF")
    assert sorted(listing(tmp_path)) == sorted([live.name, other.name, "model.gguf"])


# ---------------------------------------------------------------------------------------------- long names
def _name_max(folder: Path) -> int:
    return os.pathconf(folder, "PC_NAME_MAX")


def test_a_short_name_stages_under_its_own_name(tmp_path):
    """A name that leaves room for the tag, the pid and the random part is the staging name's part as it is."""
    assert staging_names.staging_stem(tmp_path / "model.gguf") == "model.gguf"
    assert staging_names.staging_stem(tmp_path / ("m" * (_name_max(tmp_path) - staging_names._RESERVE))) == \
        "m" * (_name_max(tmp_path) - staging_names._RESERVE)


def test_a_file_named_with_the_longest_name_the_folder_allows_is_staged_and_written(tmp_path):
    """A valid 255-byte output name (G4_05: ``[Errno 36] File name too long`` about lightprune's own hidden
    temporary file): the staged file's name part is shortened to its first bytes and a hash of the whole name, and
    fits."""
    limit = _name_max(tmp_path)
    name = "g" * (limit - 5) + ".gguf"
    seen = []
    with staging_file(tmp_path / name) as staged:
        seen.append(staged.name)
        staged.write_bytes(b"GGUF")
    assert listing(tmp_path) == [name] and (tmp_path / name).read_bytes() == b"GGUF"
    stem = staging_names.staging_stem(tmp_path / name)
    assert re.fullmatch(rf"\.g+~[0-9a-f]{{12}}{re.escape(TMP_TAG)}{os.getpid()}-[0-9a-f]{{12}}", seen[0])
    assert seen[0].startswith(f".{stem}{TMP_TAG}") and len(os.fsencode(seen[0])) <= limit
    assert len(os.fsencode(f".{stem}.lightprune-trash-{2**32}-{'0' * 12}")) <= limit  # the longest sibling fits


def test_a_long_name_is_cut_at_a_whole_character(tmp_path):
    """A name of two-byte characters cut where its bytes run out keeps whole characters (no stray byte, which would
    not be UTF-8 text); two names alike in their first bytes get different hashes."""
    limit = _name_max(tmp_path)
    one, two = "é" * (limit // 2 - 1) + "a", "é" * (limit // 2 - 1) + "b"
    stems = [staging_names.staging_stem(tmp_path / name) for name in (one, two)]
    assert all(re.fullmatch(r"é+~[0-9a-f]{12}", stem) for stem in stems) and stems[0] != stems[1]
    assert stems[0].encode().count("é".encode()) == (limit - staging_names._RESERVE - 13) // 2


def test_a_directory_named_with_the_longest_name_the_folder_allows_is_staged_replaced_and_tidied(tmp_path):
    """staging_dir's staged, ``-old-`` and ``-trash-`` names fit too, a replacement works, and the leftovers of a
    dead process under a shortened name are recognised and deleted by the next staging."""
    out = tmp_path / ("d" * _name_max(tmp_path))
    with staging_dir(out) as staged:
        write(staged, OLD)
    with staging_dir(out, overwrite=True) as staged:
        write(staged, NEW)
    assert tree(out) == NEW and listing(tmp_path) == [out.name]
    stem = staging_names.staging_stem(out)
    for kind in ("tmp", "trash"):
        write(tmp_path / f".{stem}.lightprune-{kind}-{DEAD_PID}-{os.urandom(6).hex()}", THIRD)
    other = tmp_path / f".{'d' * 20}.lightprune-tmp-{DEAD_PID}-{os.urandom(6).hex()}"  # another output's
    write(other, THIRD)
    with staging_dir(out, overwrite=True) as staged:
        write(staged, OLD)
    assert tree(out) == OLD and listing(tmp_path) == sorted([out.name, other.name])


def test_a_staged_file_a_dead_process_left_under_a_shortened_name_is_removed(tmp_path):
    out = tmp_path / ("g" * (_name_max(tmp_path) - 5) + ".gguf")
    dead = tmp_path / f".{staging_names.staging_stem(out)}{TMP_TAG}{DEAD_PID}-0123456789ab"
    dead.write_bytes(b"partial")
    with staging_file(out) as staged:
        staged.write_bytes(b"GGUF")
    assert listing(tmp_path) == [out.name]


@pytest.mark.parametrize("check, what", [(check_out_file, "output file"), (check_out_dir, "output directory"),
                                         (staging_file, "output file"), (staging_dir, "output directory")])
def test_an_output_name_longer_than_the_folder_allows_is_refused_naming_it(tmp_path, check, what):
    limit = _name_max(tmp_path)
    name = "x" * (limit + 1)
    with pytest.raises(OSError) as raised, contextlib.ExitStack() as stack:
        result = check(tmp_path / name)
        if hasattr(result, "__enter__"):
            stack.enter_context(result)
    assert raised.value.errno == errno.ENAMETOOLONG
    assert str(raised.value) == (f"[Errno {errno.ENAMETOOLONG}] {what} name {name!r} is {limit + 1} bytes long, more "
                                 f"than the {limit} the file system of {str(tmp_path)!r} allows in a name; choose a "
                                 "shorter name")
    assert listing(tmp_path) == []


@pytest.mark.parametrize("make, why", [
    (os.mkfifo, "is not a regular file (a FIFO)"),
    (lambda p: p.symlink_to(p.parent / "nowhere"), "is a dangling symlink (its target '{dir}/nowhere' does not exist)"),
])
def test_a_name_that_is_no_regular_file_is_refused_as_file_problem_says(tmp_path, make, why):
    """With or without ``overwrite``: the rename would replace a FIFO (a device) or a link with a regular file."""
    make(tmp_path / "model.gguf")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError) as raised:
            check_out_file(tmp_path / "model.gguf", overwrite=overwrite)
        assert str(raised.value) == (f"output file {str(tmp_path / 'model.gguf')!r} {why.format(dir=tmp_path)}: move "
                                     "it away, or choose another path")
    assert listing(tmp_path) == ["model.gguf"]


@pytest.mark.parametrize("value", ["no", 1, None])
def test_overwrite_must_be_a_bool_in_every_check_and_staging(tmp_path, value):
    """``overwrite="no"`` (truthy) replaced an existing output: every entry point that takes overwrite (export_pruned,
    save_pruned, prune_checkpoint, save_width_pruned, convert_to_gguf) reaches one of these, which refuse it before
    anything is read or written."""
    write(tmp_path / "out", OLD)
    (tmp_path / "out.gguf").write_bytes(b"previous")
    calls = [lambda: check_out_dir(tmp_path / "out", value), lambda: check_out_file(tmp_path / "out.gguf", value),
             lambda: staging_dir(tmp_path / "out", value).__enter__(),
             lambda: staging_file(tmp_path / "out.gguf", value).__enter__()]
    for call in calls:
        with pytest.raises(ValueError) as raised:
            call()
        assert str(raised.value) == f"overwrite must be True or False, got {value!r}"
    assert tree(tmp_path / "out") == OLD and (tmp_path / "out.gguf").read_bytes() == b"previous"
    assert listing(tmp_path) == ["out", "out.gguf"]
