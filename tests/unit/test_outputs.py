"""The output boundary (tracestory.outputs): inputs never overwritten, atomic writes, one-line
write errors, ``-`` for stdout.

Expected contents are the literal strings the tests write; expected messages are written out
by hand from the ``PATH: expected ..., found ...`` form.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from tracestory import outputs
from tracestory.errors import TracestoryError
from tracestory.outputs import (OutputError, OutputOverwritesInput, OutputPlan, atomic_path, open_output,
                                write_bytes, write_text)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


def one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and isinstance(e, TracestoryError)
    return text


# ---------------------------------------------------------------- folders

def test_missing_folders_are_created(tmp_path):
    out = tmp_path / "a" / "b" / "r.md"
    assert write_text(out, "héllo\n") == out
    assert out.read_bytes() == "héllo\n".encode("utf-8")
    assert leftovers(out.parent) == []


def test_a_folder_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError) as e:
        write_text(tmp_path / "afile" / "sub" / "r.md", "y")
    assert one_line(e.value).endswith("expected a folder that can be created, found not a directory")
    assert (tmp_path / "afile").read_text() == "x"


def test_a_folder_given_as_a_file(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputError) as e:
        write_text(tmp_path / "d", "x")
    assert one_line(e.value) == f"{tmp_path / 'd'}: expected a file path, found a folder"


def test_read_only_folder_leaves_the_old_file(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "r.md").write_text("old report")
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        probe = folder / "probe"
        try:
            probe.write_text("")
            chmod_works = False          # root: permission bits do not stop writes
            probe.unlink()
        except PermissionError:
            chmod_works = True
        if not chmod_works:              # a writer that fails as a read-only folder would
            def refuse(*a, **k):
                raise PermissionError(errno.EACCES, "Permission denied")
            monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
        with pytest.raises(OutputError) as e:
            write_text(folder / "r.md", "new report")
        assert one_line(e.value) == f"{folder / 'r.md'}: expected a writable output file, found permission denied"
        assert (folder / "r.md").read_text() == "old report"
        assert leftovers(folder) == []
    finally:
        folder.chmod(stat.S_IRWXU)


# ---------------------------------------------------------------- failures part-way

def test_full_disk_part_way_keeps_the_old_file_and_leaves_no_partial(tmp_path):
    out = tmp_path / "report.md"
    out.write_text("good report, 39,523 bytes in real life")
    with pytest.raises(OutputError) as e:
        with open_output(out) as fh:
            fh.write("half of a new rep")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert one_line(e.value) == f"{out}: expected a writable output file, found no space left on device"
    assert out.read_text() == "good report, 39,523 bytes in real life"
    assert leftovers(tmp_path) == []


def test_atomic_path_for_writers_that_need_a_name(tmp_path):
    out = tmp_path / "plot.png"
    out.write_bytes(b"old")
    with pytest.raises(OutputError):
        with atomic_path(out) as tmp:
            assert tmp.parent == tmp_path and tmp.name.endswith("-plot.png") and tmp.name.startswith(".tmp-")
            tmp.write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert out.read_bytes() == b"old" and leftovers(tmp_path) == []
    with atomic_path(out) as tmp:
        tmp.write_bytes(b"new picture")
    assert out.read_bytes() == b"new picture" and leftovers(tmp_path) == []


def test_other_exceptions_propagate_and_leave_nothing(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("{}")
    with pytest.raises(ZeroDivisionError):
        with open_output(out) as fh:
            fh.write('{"a": ')
            1 / 0
    assert out.read_text() == "{}" and leftovers(tmp_path) == []


def test_new_file_mode_follows_the_umask_and_an_old_file_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "new.md", "x")
        assert stat.S_IMODE((tmp_path / "new.md").stat().st_mode) == 0o644
        (tmp_path / "exec.sh").write_text("old")
        (tmp_path / "exec.sh").chmod(0o755)
        write_text(tmp_path / "exec.sh", "new")
        assert stat.S_IMODE((tmp_path / "exec.sh").stat().st_mode) == 0o755
    finally:
        os.umask(old)


# ---------------------------------------------------------------- special files

def test_dev_full_is_one_line_and_stays_a_device():
    with pytest.raises(OutputError) as e:
        write_bytes("/dev/full", b"x" * 100_000)
    assert one_line(e.value) == "/dev/full: expected a writable output file, found no space left on device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_dev_null_is_written_in_place():
    assert write_text("/dev/null", "discarded") == Path("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("path", ["/proc/tracestory-report.md", "/proc/self/tracestory/r.md"])
def test_proc_is_one_line(path):
    with pytest.raises(OutputError) as e:
        write_text(path, "x")
    assert one_line(e.value).startswith(path.rsplit("/", 1)[0])
    assert not os.path.exists(path)


# ---------------------------------------------------------------- stdout

def test_dash_is_stdout(capsys):
    assert write_text("-", "to the terminal\n") is None
    assert capsys.readouterr().out == "to the terminal\n"
    assert OutputPlan(inputs=["-"]).check("-") is None


# ---------------------------------------------------------------- inputs never overwritten

@pytest.fixture
def inputs(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text('{"traceEvents": []}')
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank0.trace.json.gz").write_bytes(b"\x1f\x8b rank 0")
    (ranks / "sub").mkdir()
    (ranks / "sub" / "rank1.trace.json.gz").write_bytes(b"\x1f\x8b rank 1")
    return tmp_path, trace, ranks


def test_the_input_itself_under_another_spelling(inputs, monkeypatch):
    tmp, trace, _ = inputs
    monkeypatch.chdir(tmp)
    plan = OutputPlan(inputs=["trace.json"])
    with pytest.raises(OutputOverwritesInput) as e:
        plan.write_text("./ranks/../trace.json", "# report")
    assert one_line(e.value) == ("./ranks/../trace.json: expected a path for the output that is not an input, "
                                 "found the input trace.json")
    assert trace.read_text() == '{"traceEvents": []}'


def test_hardlink_alias(inputs):
    tmp, trace, _ = inputs
    alias = tmp / "alias.md"
    os.link(trace, alias)
    with pytest.raises(OutputOverwritesInput, match="found the input .*trace.json"):
        OutputPlan(inputs=[trace]).write_text(alias, "# report")
    assert trace.read_text() == '{"traceEvents": []}'


def test_symlink_alias(inputs):
    tmp, trace, _ = inputs
    link = tmp / "link.html"
    link.symlink_to(trace)
    with pytest.raises(OutputOverwritesInput):
        OutputPlan(inputs=[trace]).check(link, "--html")
    # and the other way round: the input named through a link, the output by its real name
    with pytest.raises(OutputOverwritesInput):
        OutputPlan(inputs=[link]).check(trace)


def test_members_of_an_input_folder(inputs):
    _, _, ranks = inputs
    plan = OutputPlan(inputs=[ranks])
    for member in (ranks / "rank0.trace.json.gz", ranks / "sub" / "rank1.trace.json.gz"):
        with pytest.raises(OutputOverwritesInput, match="in the input folder"):
            plan.check(member)
    assert plan.check(ranks / "report.md") == ranks / "report.md"   # a new file, not an input
    assert (ranks / "rank0.trace.json.gz").read_bytes() == b"\x1f\x8b rank 0"


def test_hardlink_of_a_folder_member_elsewhere(inputs):
    tmp, _, ranks = inputs
    os.link(ranks / "rank0.trace.json.gz", tmp / "copy.json.gz")
    with pytest.raises(OutputOverwritesInput):
        OutputPlan(inputs=[ranks]).check(tmp / "copy.json.gz")


def test_one_file_for_two_outputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = OutputPlan()
    plan.check("r.md", "report")
    plan.check("r.md", "report")      # checked again by the same writer: fine
    with pytest.raises(OutputError) as e:
        plan.check("./r.md", "--html")
    assert one_line(e.value) == "r.md: expected one file per output (--html), found the same file as the report"


def test_a_folder_that_will_be_replaced_may_not_hold_an_input(inputs):
    tmp, trace, ranks = inputs
    plan = OutputPlan(inputs=[ranks / "sub" / "rank1.trace.json.gz"])
    with pytest.raises(OutputOverwritesInput, match="expected no input inside the output folder"):
        plan.check_folder(ranks)
    with pytest.raises(OutputOverwritesInput):
        OutputPlan(inputs=[ranks]).check_folder(ranks)
    assert plan.check_folder(tmp / "elsewhere") == tmp / "elsewhere"


# ---------------------------------------------------------------- '-' and sets of outputs

def test_two_outputs_on_stdout_are_refused_one_is_fine():
    plan = OutputPlan()
    assert plan.check("-", "--json") is None and plan.check("-", "--json") is None   # the same output again
    with pytest.raises(OutputError) as e:
        plan.check("-", "-o")
    assert one_line(e.value) == ("-: expected standard output for one output only (-o), found the --json there "
                                 "too (give one of them a file)")


def test_a_named_writer_on_dash_goes_to_stdout(capsysbinary, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with atomic_path("-") as tmp:
        tmp.write_bytes(b"\x00binary\xff")   # as gzip or matplotlib would, by name
    assert capsysbinary.readouterr().out == b"\x00binary\xff" and list(tmp_path.iterdir()) == []


def test_all_or_nothing_writes_the_whole_set_at_the_end(tmp_path, capsys):
    a, b = tmp_path / "a.md", tmp_path / "sub" / "b.json"
    a.write_text("old a\n")
    with outputs.all_or_nothing():
        write_text(a, "new a\n")
        write_text("-", "data\n")
        with atomic_path(b) as tmp:
            tmp.write_text("b\n")
        assert a.read_text() == "old a\n" and not b.exists()       # nothing in place yet
        assert outputs.staged(a).read_text() == "new a\n"            # readable where it is staged
        assert capsys.readouterr().out == ""                        # stdout held back too
    assert (a.read_text(), b.read_text(), capsys.readouterr().out) == ("new a\n", "b\n", "data\n")
    assert leftovers(tmp_path) == [] and leftovers(b.parent) == [] and outputs.staged(a) == a


def test_all_or_nothing_leaves_nothing_when_one_output_fails(tmp_path, capsys):
    a = tmp_path / "a.md"
    a.write_text("old a\n")
    (tmp_path / "blocker").write_text("x")
    with pytest.raises(OutputError):
        with outputs.all_or_nothing():
            write_text(a, "new a\n")
            write_text("-", "data\n")
            write_text(tmp_path / "blocker" / "b.json", "b\n")     # its folder is a file
    assert a.read_text() == "old a\n" and capsys.readouterr().out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "blocker"]


def test_prints_to_stderr_keeps_dash_outputs_on_stdout(capsys):
    with outputs.prints_to_stderr():
        print("status")
        write_text("-", "data\n")
    out, err = capsys.readouterr()
    assert (out, err) == ("data\n", "status\n")


def test_open_stream_dash_is_stdout_and_a_file_is_written_as_it_goes(tmp_path, capsys):
    fh = outputs.open_stream("-")
    fh.write("line\n")
    fh.flush()
    assert capsys.readouterr().out == "line\n"
    f = outputs.open_stream(tmp_path / "r.jsonl")
    f.write("x\n")
    f.flush()
    assert (tmp_path / "r.jsonl").read_text() == "x\n"
    f.close()
    with pytest.raises(OutputError):
        outputs.open_stream(tmp_path / "r.jsonl" / "sub")
