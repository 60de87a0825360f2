"""The scheduler event log reader on the example of docs/SCHEDULER_LOG.md, read by hand."""

from __future__ import annotations

from conftest import REPO

from tracestory.ingest.scheduler_log import is_scheduler_log, read_scheduler_log


def test_the_documented_example_reads_as_written(tmp_path):
    doc = (REPO / "docs" / "SCHEDULER_LOG.md").read_text()
    example = doc.split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "sched.jsonl"
    path.write_text(example)
    assert is_scheduler_log(path)
    log = read_scheduler_log(path)
    assert (log.meta.version, log.meta.block_size, log.meta.num_blocks) == (1, 16, 64)
    (it,) = log.iterations
    assert (it.iter, it.duration_ns, it.prefill_tokens, it.decode_seqs, it.kind) == (0, 898_000, 40, 0, "prefill-only")
    assert (it.kv_in_use, it.kv_total, it.decisions[0].action) == (3, 64, "admit")
    assert [a.request_id for a in log.arrivals] == ["r0"] and log.finishes[0].output_tokens == 4
