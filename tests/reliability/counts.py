"""Re-count the reliability classes of issue 25 that the input/output work covers: run their
tests, read each case's outcome from pytest's JUnit XML, and print the Markdown table of
docs/RELIABILITY.md ("Bounded sniffs, outputs and tracebacks").

    PYTHONPATH=src python3 tests/reliability/counts.py            # from the repository root

A case is one test item (a parametrized test counts once per parameter); it passes when the
command ended as its row says (each test asserts that ending: one line and exit 2, the input
held, stdout holding only the data, ...). Classes and their tests are listed in CLASSES; a test
of those files that no class names is an error, so a new case cannot go uncounted.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = ("tests/ingest/test_sniff_bounds.py", "tests/reliability/test_silent_damage.py",
         "tests/cli/test_output_flags.py", "tests/cli/test_lazy_imports.py")

# (class, how each case ends, test function names)
CLASSES = (
    ("inputs: sniffs and header reads of a one-line Kineto trace (plain, gzip), long first lines, FIFOs",
     "done: each sniff reads at most 64 KiB, answers right", ("test_each_sniff_reads_at_most_the_bound",
     "test_a_head_is_the_file_start_inflated", "test_scheduler_log_meta_line_found_and_long_first_line_refused",
     "test_summary_sniff_still_reads_a_load_summary", "test_sniffs_answer_no_for_special_files")),
    ("inputs: Kineto kernels without `dur` (all, two thirds)", "refused (all); done, stated on stderr, JSON, "
     "Limitations, verdict not judged (some)", ("test_kernels_all_without_dur_are_refused",
                                               "test_kernels_without_dur_are_stated_and_no_verdict_is_built_on_them")),
    ("inputs: Kineto damage classes on the analyze terminal (no ph, no cat, text ts, numeric name)",
     "done, stated: one `FILE: warning:` line on stderr", ("test_reader_damage_is_on_the_analyze_terminal",)),
    ("inputs: integers out of range (2^64 correlation id, 2^40 grid, 2^64 block)", "refused, one line, exit 2",
     ("test_out_of_range_integers_are_one_line",)),
    ("outputs: `--rules`/`--peaks` file or a file a `ranks` glob matches, named as an output (report, analyze, "
     "categories, compare, export, ranks)", "refused before reading; the file held",
     ("test_rules_and_peaks_files_are_inputs", "test_a_file_a_glob_matches_is_an_input")),
    ("outputs: two flags naming one file (`-o r.md --json r.md`, `--html`, `./r.md`; report, analyze, compare, "
     "ranks)", "refused; nothing written", ("test_two_flags_naming_one_file_are_refused",)),
    ("outputs: two flags on stdout (report, compare, ranks)", "refused; stdout empty",
     ("test_two_flags_on_stdout_are_refused",)),
    ("outputs: `serve --event-log -` (stdout holds the server's status lines)", "refused, one line, exit 2",
     ("test_serve_event_log_dash_is_refused",)),
    ("outputs: `-` as stdout (export perfetto -o, report --json/--html, check --json, compare -o/--json, ranks "
     "-o/--json, load --json/--output)", "stdout holds only the data; status on stderr; no file `-`",
     ("test_export_perfetto_to_stdout", "test_report_json_and_html_to_stdout", "test_check_json_to_stdout",
      "test_compare_outputs_to_stdout", "test_ranks_outputs_to_stdout", "test_load_json_and_output_to_stdout")),
    ("outputs: a report set whose second file fails", "held: no file of the set written, the old report kept",
     ("test_report_set_is_all_or_nothing",)),
    ("subcommands: `--peaks`/`--rules` missing, a folder or over 16 MiB, `demo --output-dir FILE` and `/proc/...`, "
     "`analyze > /dev/full`", "refused, one line, exit 2", ("test_missing_peaks_and_rules_files",
                                                          "test_demo_output_dir_that_cannot_be_a_folder",
                                                          "test_full_stdout_is_one_line")),
    ("start-up: `--version` and `analyze` import only their own code; help from one table", "done",
     ("test_version_imports_no_command", "test_analyze_imports_no_serve_bench_capture_or_loadgen",
      "test_help_lists_every_command_with_its_own_help")),
)


def main(files: tuple[str, ...] = FILES, classes: tuple = CLASSES) -> int:
    """Run ``files`` and print the table of ``classes`` (the defaults: this page's classes)."""
    with tempfile.TemporaryDirectory() as d:
        xml = Path(d) / "junit.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *files],
                       cwd=REPO, stdout=subprocess.DEVNULL)
        cases = [(tc.get("name"), tc.find("failure") is None and tc.find("error") is None
                  and tc.find("skipped") is None) for tc in ET.parse(xml).getroot().iter("testcase")]
    by_func: dict[str, list[bool]] = {}
    for name, ok in cases:
        by_func.setdefault(name.split("[", 1)[0], []).append(ok)
    named = {f for _, _, funcs in classes for f in funcs}
    unnamed = sorted(set(by_func) - named)
    if unnamed:
        print(f"tests no class names: {unnamed}", file=sys.stderr)
        return 1
    print("| class | cases | ended as stated | other | how each ends |")
    print("| --- | ---: | ---: | ---: | --- |")
    total = good = 0
    for cls, ends, funcs in classes:
        oks = [ok for f in funcs for ok in by_func.get(f, [])]
        total, good = total + len(oks), good + sum(oks)
        print(f"| {cls} | {len(oks)} | {sum(oks)} | {len(oks) - sum(oks)} | {ends} |")
    print(f"\n{total} cases, {good} ended as stated, {total - good} did not.")
    return 0 if good == total else 1


if __name__ == "__main__":
    sys.exit(main())
