"""What each reader checks against the file's own totals, on small inputs written here with
the expected outcome stated by hand next to them."""

from __future__ import annotations

import csv
import io
import logging
import sqlite3

import pytest
from conftest import NCU_DETAILS, NCU_RAW, NSYS_2022

from tracestory.errors import TraceFormatError
from tracestory.ingest.files import warnings_of
from tracestory.ingest.ncu import load_ncu
from tracestory.ingest.nsys_csv import load_nsys_csv
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

KERN_SUM_HEAD = "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"


# ---------------------------------------------------------------------- nsys stats CSV
def test_kern_sum_consistent_rows_give_no_warning(tmp_path):
    p = tmp_path / "k.csv"
    # 900 = 3 x 300, 100 = 1 x 100; 90% + 10% = 100%
    p.write_text(KERN_SUM_HEAD + '90.0,900,3,300.0,300.0,300,300,0.0,a\n10.0,100,1,100.0,100.0,100,100,0.0,b\n')
    t, = load_nsys_csv(p)
    assert len(t.kernels) == 4 and warnings_of(t) == ()


def test_kern_sum_total_that_disagrees_with_avg_times_instances_is_stated(tmp_path):
    p = tmp_path / "k.csv"
    # row a: Avg 300 x 3 instances = 900, but Total says 9000 (one digit too many)
    p.write_text(KERN_SUM_HEAD + '90.0,9000,3,300.0,300.0,300,300,0.0,a\n10.0,100,1,100.0,100.0,100,100,0.0,b\n')
    t, = load_nsys_csv(p)
    assert int((t.kernels["end_ns"] - t.kernels["start_ns"]).sum()) == 9100  # the file's totals, as written
    assert any("1 of 2 rows whose Avg x Instances" in w for w in warnings_of(t))


def test_kern_sum_missing_rows_caught_by_the_percent_column(tmp_path, caplog):
    p = tmp_path / "k.csv"
    # the 10% row is gone: the rows left sum to 90%
    p.write_text(KERN_SUM_HEAD + '90.0,900,3,300.0,300.0,300,300,0.0,a\n')
    with caplog.at_level(logging.WARNING, logger="tracestory.ingest"):
        t, = load_nsys_csv(p)
    assert any("sums to 90.0%" in w for w in warnings_of(t))
    assert [r.getMessage() for r in caplog.records] == [f"{p}: warning: {w}" for w in warnings_of(t)]


def test_kern_sum_negative_total_and_zero_instances_dropped(tmp_path):
    p = tmp_path / "k.csv"
    p.write_text(KERN_SUM_HEAD + '50.0,-500,1,-500.0,0,0,0,0.0,a\n25.0,250,0,0.0,0,0,0,0.0,b\n'
                 '25.0,250,1,250.0,250.0,250,250,0.0,c\n')
    t, = load_nsys_csv(p)
    assert len(t.kernels) == 1 and t.name(int(t.kernels["name"][0])) == "c"
    assert any("2 of 3 cuda_gpu_kern_sum rows dropped" in w for w in warnings_of(t))


def test_gpu_trace_negative_and_overflowing_durations_dropped(tmp_path):
    head = "Start (ns),Duration (ns),CorrId,Strm,Name\n"
    p = tmp_path / "t.csv"
    p.write_text(head + "100,50,1,7,k1\n200,-30,2,7,k2\n300,1e30,3,7,k3\n400,20,4,7,k4\n")
    t, = load_nsys_csv(p)
    assert list(t.kernels["end_ns"] - t.kernels["start_ns"]) == [50, 20]
    assert any("2 of 4 cuda_gpu_trace rows dropped" in w for w in warnings_of(t))


def test_gpu_trace_with_no_usable_row_refused(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("Start (ns),Duration (ns),CorrId,Strm,Name\n100,-5,1,7,k1\n")
    with pytest.raises(TraceFormatError, match="at least one usable row"):
        load_nsys_csv(p)


def test_csv_without_final_newline_drops_its_last_row(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("Start (ns),Duration (ns),CorrId,Strm,Name\n100,50,1,7,k1\n200,60,2,7,k2")  # k2 may be cut
    t, = load_nsys_csv(p)
    assert len(t.kernels) == 1 and any("ends mid-row" in w for w in warnings_of(t))


# ---------------------------------------------------------------------- ncu CSV
def _details_rows() -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(open(NCU_DETAILS, newline="")))
    return rows[0], rows[1:]


def _write(path, header, body):
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([header, *body])
    path.write_text(buf.getvalue())
    return path


def test_details_kernel_with_a_damaged_id_is_dropped_and_stated(tmp_path):
    header, body = _details_rows()
    i = header.index("ID")
    first_of_2 = next(k for k, r in enumerate(body) if r[i] == "2")
    body[first_of_2][i] = "9"  # one row of kernel 2 now claims an ID of its own
    km = load_ncu(_write(tmp_path / "d.csv", header, body))
    # "9" holds that one row (of 87): a fragment, dropped; kernel 2 lacks it (86 of 87): kept, stated
    assert [k.id for k in km] == [0, 1, 2, 3, 4, 5]
    assert any(w.startswith("1 of 7 kernels with under half") and "ID 9: 1 rows" in w for w in km.warnings)
    assert any(w.startswith("1 kernels without some") and "ID 2: 1 missing" in w for w in km.warnings)


def test_details_cut_inside_a_row_drops_the_last_kernel(tmp_path):
    text = NCU_DETAILS.read_text()
    last_id_5 = text.rindex('\n"5",')
    p = tmp_path / "d.csv"
    p.write_text(text[:last_id_5 + 30])  # inside the last row of kernel 5
    km = load_ncu(p)
    assert [k.id for k in km] == [0, 1, 2, 3, 4]
    assert any("its last kernel (ID 5" in w for w in km.warnings)


def test_raw_cut_inside_the_last_row_drops_that_kernel(tmp_path):
    text = NCU_RAW.read_text()
    p = tmp_path / "r.csv"
    p.write_text(text[:-200])
    km = load_ncu(p)
    assert len(km) == 5 and any("last kernel" in w for w in km.warnings)


def test_raw_repeated_ids_stated(tmp_path):
    rows = list(csv.reader(open(NCU_RAW, newline="")))
    rows[3][0] = rows[2][0]  # the second kernel row now repeats the first one's ID
    km = load_ncu(_write(tmp_path / "r.csv", rows[0], rows[1:]))
    assert any("1 kernel IDs appear more than once" in w for w in km.warnings)


def test_non_integer_kernel_id_refused(tmp_path):
    rows = list(csv.reader(open(NCU_RAW, newline="")))
    rows[2][0] = "x1"
    with pytest.raises(TraceFormatError, match="an integer kernel ID"):
        load_ncu(_write(tmp_path / "r.csv", rows[0], rows[1:]))


def test_unterminated_quote_refused_in_one_line(tmp_path):
    p = tmp_path / "r.csv"
    p.write_bytes(NCU_RAW.read_bytes().replace(b'"', b"", 1))  # the header's first quote
    with pytest.raises(TraceFormatError) as e:
        load_ncu(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


# ---------------------------------------------------------------------- nsys SQLite
def _copy(tmp_path, sql: str):
    p = tmp_path / "n.sqlite"
    p.write_bytes(NSYS_2022.read_bytes())
    con = sqlite3.connect(p)
    con.execute(sql)
    con.commit()
    con.close()
    return p


def test_sqlite_memcpy_end_before_start_dropped_and_counted(tmp_path):
    con = sqlite3.connect(NSYS_2022)
    n_copies, = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
    con.close()
    assert n_copies >= 2
    p = _copy(tmp_path, 'UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET "end" = start - 1 WHERE rowid = '
                        "(SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_MEMCPY)")
    ts = load_nsys_sqlite(p)
    copies = sum(int((t.memops["kind"] != 0).sum()) for t in ts)
    assert copies == n_copies - 1
    assert f"CUPTI_ACTIVITY_KIND_MEMCPY: 1 of {n_copies} rows dropped" in warnings_of(ts[0])[0]


def test_sqlite_nvtx_range_ending_before_it_starts_is_dropped_not_unterminated(tmp_path):
    con = sqlite3.connect(NSYS_2022)
    n, = con.execute('SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND "end" IS NOT NULL').fetchone()
    con.close()
    p = _copy(tmp_path, 'UPDATE NVTX_EVENTS SET "end" = start - 10 WHERE rowid = (SELECT min(rowid) FROM '
                        'NVTX_EVENTS WHERE eventType IN (59, 60) AND "end" IS NOT NULL)')
    t, = load_nsys_sqlite(p)
    assert len(t.ranges) == n - 1 + 0 and t.meta.extra["nvtx_unterminated"] == 0
    assert any(w.startswith("NVTX_EVENTS: 1 of") for w in warnings_of(t))


def test_sqlite_cut_short_refused_by_its_header_page_count(tmp_path):
    data = NSYS_2022.read_bytes()
    p = tmp_path / "n.sqlite"
    p.write_bytes(data[:-4096])  # one page less than the header's page count
    with pytest.raises(TraceFormatError, match="cut short"):
        load_nsys_sqlite(p)
