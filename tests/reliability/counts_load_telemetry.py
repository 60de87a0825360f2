"""Re-count the load-generator and telemetry classes of issue 25: run their tests, read each case's
outcome from pytest's JUnit XML (tests/reliability/counts.py does the counting), and print the
Markdown table of docs/RELIABILITY.md ("Load generator and telemetry").

    PYTHONPATH=src python3 tests/reliability/counts_load_telemetry.py     # from the repository root

A case is one test item (a parametrized test counts once per parameter); each test asserts the
ending its row states. A test of these files that no class names is an error.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from counts import main  # noqa: E402

FILES = ("tests/loadgen/test_load_usage.py", "tests/telemetry/test_telemetry_failures.py",
         "tests/loadgen/test_load_session.py")

CLASSES = (
    ("load: a server's `usage` that is not a credible count (negative, 3.5, 5.0, \"5\", true, 3.9e12, over "
     "2 x max_tokens x choices + 16, under half the token events, a prompt count over the prompt's bytes + 1024), "
     "streaming and not", "failed `bad_usage` with its reason, never counted; `usage_rejected` in the result "
     "(without streaming the token-event bound does not apply: accepted, as documented)",
     ("test_a_bad_usage_is_a_failure_with_its_reason",)),
    ("load: usage within the bounds, or a field left out / null", "used (or our own count, stated by its source)",
     ("test_usage_within_the_bounds_or_left_out_is_used", "test_check_usage_bounds_with_an_exact_tokenizer",
      "test_several_choices_per_request_widen_the_completion_bound")),
    ("load: every response with negative completion tokens, through the CLI", "exit 1, throughput 0.00, "
     "`Usage rejected: 3`, summary `failures: {bad_usage: 3}`",
     ("test_the_cli_never_prints_a_throughput_from_a_negative_usage",)),
    ("telemetry: NVML energy counter reset (sampler; a file written before the fix)",
     "segments summed (3 J, 3.5 J), never negative; resets listed / stated",
     ("test_a_counter_reset_is_summed_not_negative", "test_a_file_with_a_raw_counter_drop_is_continued_and_stated")),
    ("telemetry: inside the sampler (a reading raising, NaN / negative / text values, an NVML error after the "
     "start, the thread dying on a full disk, NVML failing at start, shutdown failing)",
     "reading null or telemetry off, reason kept in `incomplete`; nothing raised to the caller",
     ("test_a_reading_that_raises_is_null_and_the_sampling_goes_on", "test_a_bad_value_is_null_and_stated",
      "test_an_nvml_error_after_the_start_is_stated", "test_a_dying_sampling_thread_does_not_reach_the_caller",
      "test_a_source_that_fails_to_start_turns_telemetry_off",
      "test_stop_never_raises_even_when_the_source_shutdown_fails")),
    ("telemetry failing during a capture (telemetry block; a real CPU torch capture) and during a load",
     "capture `complete`, exit 0; load exit 0; \"telemetry incomplete: <reason>\" in the manifest / result, "
     "stderr and the report's Limitations",
     ("test_capture_records_incomplete_telemetry_and_its_steps_decide",
      "test_a_real_capture_with_a_failing_sampler_is_complete",
      "test_a_failing_sampler_is_stated_and_the_load_still_succeeds")),
    ("load: the session is one library call (`run_session`)", "done: returns the outcome, writes the files",
     ("test_run_session_returns_the_outcome_and_writes_the_files",)),
)

if __name__ == "__main__":
    sys.exit(main(FILES, CLASSES))
