"""``tracestory analyze --table NAME --format csv|json|markdown|table -o FILE|-`` and ``--json -``.

Second sources: SQLite queries on the Nsight Systems export's CUPTI kernel table grouped by the
demangled name (what ``nsys stats --report cuda_gpu_kern_sum`` groups by), Python's
``statistics`` for the median and the sample standard deviation (``statistics.stdev``, the one
``nsys stats`` prints); for the per-op rows, ``json.load`` of the Kineto file: each GPU event is
given to its launch call by ``correlation`` and then to the longest ``cpu_op`` of the same pid
and tid that contains the launch's ts (the top-level op), summed in plain Python.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sqlite3
import statistics
from collections import defaultdict

import pytest
from conftest import H100_BERT, NSYS_2024

from tracestory.cli import main


def _run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _sql(query: str) -> list[tuple]:
    with sqlite3.connect(NSYS_2024) as db:
        return db.execute(query).fetchall()


def test_kernels_csv_is_cuda_gpu_kern_sum_computed_in_sql(capsys):
    code, out, err = _run(capsys, "analyze", NSYS_2024, "--table", "kernels", "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))   # stdout holds the CSV and nothing else
    durations = defaultdict(list)
    for name, d in _sql("SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                        "JOIN StringIds s ON s.id = k.demangledName"):
        durations[name].append(d)
    summary = _sql("SELECT s.value, count(*), sum(k.end - k.start), min(k.end - k.start), max(k.end - k.start) "
                   "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
                   "GROUP BY s.value ORDER BY 3 DESC, 2, 1")
    grand = sum(r[2] for r in summary)
    assert len(rows) == len(summary) == 102
    assert list(rows[0]) == ["name", "count", "total_ns", "share", "mean_ns", "median_ns", "min_ns", "max_ns",
                             "stddev_ns"]
    for row, (name, count, total, mn, mx) in zip(rows, summary):
        d = durations[name]
        assert (row["name"], int(row["count"]), int(row["total_ns"]), int(row["min_ns"]), int(row["max_ns"])) == \
            (name, count, total, mn, mx)
        assert float(row["share"]) == pytest.approx(total / grand, rel=1e-12)
        assert float(row["mean_ns"]) == pytest.approx(statistics.mean(d), rel=1e-12)
        assert float(row["median_ns"]) == pytest.approx(statistics.median(d), rel=1e-12)
        assert float(row["stddev_ns"]) == pytest.approx(statistics.stdev(d) if len(d) > 1 else 0.0, rel=1e-9)


def test_table_to_a_file_and_dash_for_stdout(capsys, tmp_path):
    out_file = tmp_path / "k.csv"
    code, out, err = _run(capsys, "analyze", NSYS_2024, "--table", "kernels", "--format", "csv", "-o", out_file)
    assert code == 0, err
    assert out == f"wrote {out_file}\n"   # only the status line when the table goes to a file
    code, out2, _ = _run(capsys, "analyze", NSYS_2024, "--table", "kernels", "--format", "csv", "-o", "-")
    assert code == 0 and out2 == out_file.read_text()
    assert not (tmp_path / "-").exists()


def test_json_dash_is_json_alone_on_stdout(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "analyze", H100_BERT, "--json", "-")
    assert code == 0, err
    doc = json.loads(out)   # the whole of stdout parses: the terminal tables went elsewhere
    # kernel count by a plain count of the file's kernel events
    with gzip.open(H100_BERT, "rt") as f:
        n_kernels = sum(e.get("cat") == "kernel" for e in json.load(f)["traceEvents"])
    assert doc["traces"][0]["gpu"]["kernel_count"] == n_kernels == 60
    assert "GPU time by category" in err   # the terminal tables went to stderr
    assert not (tmp_path / "-").exists()


def test_table_as_json_records(capsys):
    code, out, err = _run(capsys, "analyze", NSYS_2024, "--table", "kernels", "--format", "json")
    assert code == 0, err
    records = json.loads(out)
    (count,) = _sql("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    assert sum(r["count"] for r in records) == count


def test_csv_needs_a_table_and_stdout_is_not_shared(capsys):
    code, out, err = _run(capsys, "analyze", NSYS_2024, "--format", "csv")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--table" in err
    code, out, err = _run(capsys, "analyze", NSYS_2024, "--table", "kernels", "--format", "csv", "--json", "-")
    assert code == 2 and out == "" and "stdout" in err


@pytest.mark.parametrize("flag", ["-o", "--json"])
def test_refuses_to_overwrite_an_input(capsys, tmp_path, flag):
    src = tmp_path / "t.json.gz"
    src.write_bytes(H100_BERT.read_bytes())
    before = src.read_bytes()
    code, out, err = _run(capsys, "analyze", src, "--table", "ops", "--format", "csv", flag, src)
    assert code == 2
    assert src.read_bytes() == before
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(src) in lines[0] and "input" in lines[0]


def _ns(us: float) -> int:
    return int(round(us * 1000.0))


def _top_level_from_json(path):
    """{(name, dims json, types json): [gpu_ns, kernels]} of the top-level cpu_ops, and the GPU
    time no op takes, summed straight from the file (see the module docstring)."""
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops = [e for e in events if e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#")]
    rows = defaultdict(lambda: [0, 0])
    rest = 0
    for g in events:
        if g.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        launch = launches.get(g["args"].get("correlation"))
        t = _ns(launch["ts"]) if launch else None
        chain = [o for o in ops if launch and o["pid"] == launch["pid"] and o["tid"] == launch["tid"]
                 and _ns(o["ts"]) <= t < _ns(o["ts"]) + _ns(o["dur"])]
        if not chain:
            rest += _ns(g["dur"])
            continue
        top = max(chain, key=lambda o: _ns(o["dur"]))
        a = top["args"]
        key = (top["name"], json.dumps(a.get("Input Dims")), json.dumps(a.get("Input type")))
        rows[key][0] += _ns(g["dur"])
        rows[key][1] += g["cat"] == "kernel"
    return dict(rows), rest


def test_ops_rows_are_sums_of_the_json(capsys):
    code, out, err = _run(capsys, "analyze", H100_BERT, "--table", "ops", "--format", "csv")
    assert code == 0, err
    want, rest = _top_level_from_json(H100_BERT)
    got, other = {}, 0
    for r in csv.DictReader(io.StringIO(out)):
        if r["kind"] == "none":    # the GPU time no op can be given
            other += int(r["total_ns"])
            continue
        key = (r["name"], json.dumps(json.loads(r["input_dims"])), json.dumps(json.loads(r["input_types"])))
        got[key] = [int(r["total_ns"]), int(r["kernels"])]
    assert got == want
    assert other == rest
    # by hand from the file: 17 calls of aten::linear [[1, 141, 512], [512, 512], [512]] lead
    assert max(want.items(), key=lambda kv: kv[1][0])[0][0] == "aten::linear"


def test_markdown_and_terminal_views(capsys, tmp_path):
    md = tmp_path / "ops.md"
    code, _, err = _run(capsys, "analyze", H100_BERT, "--table", "ops", "--format", "markdown", "-o", md)
    assert code == 0, err
    lines = md.read_text().splitlines()
    want, _ = _top_level_from_json(H100_BERT)
    assert lines[0].startswith("| name | kind | input_dims |")
    assert sum(1 for ln in lines[2:] if ln.startswith("| aten::")) == len(want)
    code, out, err = _run(capsys, "analyze", H100_BERT, "--table", "modules")
    assert code == 0, err
    assert "BertLMHeadModel_0" in out   # module names from the file's nn.Module events


def test_terminal_table_leaves_out_what_does_not_fit_and_says_so():
    """A narrow terminal keeps the row name, total_ns and share (the columns every table has, read
    from the CSV header) and names every column it left out; a wide one shows them all."""
    from rich.console import Console

    from tracestory.analysis.results import analyze_inputs
    from tracestory.ingest import load_inputs
    from tracestory.render.tables_out import table_renderable

    results = analyze_inputs(load_inputs([H100_BERT]))
    table = results.table("ops", 0)
    header = table_text_header(table)

    def shown(width):
        console = Console(file=io.StringIO(), width=width, color_system=None)
        console.print(table_renderable(table, "ops", width))
        return console.file.getvalue()

    narrow = shown(60)
    head_line = next(line for line in narrow.splitlines() if "name" in line)
    kept = [c for c in header if f" {c} " in head_line]
    assert kept[0] == "name" and "total_ns" in kept and "share" in kept
    left = [c for c in header if c not in kept]
    assert left and f"left out for width: {', '.join(left)}" in " ".join(narrow.split())
    assert max(len(line) for line in narrow.splitlines()) <= 60
    wide = shown(400)
    assert "left out" not in wide and all(f" {c} " in wide for c in header)


def table_text_header(table) -> list[str]:
    from tracestory.render.tables_out import table_text

    return next(csv.reader(io.StringIO(table_text(table, "csv"))))
