"""Run a command; print its peak resident memory; fail when that is above a limit.

Usage: python3 .ci/peak_rss.py LIMIT_BYTES COMMAND...

The number is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` once the command has ended: the largest
resident set of any one process of the command's tree that was waited for (pytest itself, or a
subprocess a test started), not the sum of processes alive at the same time. The command's
own exit code wins (pytest's 5, "no tests ran", fails); a peak above the limit is exit 3.
"""

import resource
import subprocess
import sys


def main() -> int:
    limit, cmd = int(float(sys.argv[1])), sys.argv[2:]
    rc = subprocess.call(cmd)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    print(f"ci: peak RSS of one process of `{' '.join(cmd)}`: {peak / 1e9:.2f} GB (limit {limit / 1e9:.1f} GB)",
          file=sys.stderr)
    if rc != 0:
        return rc
    if peak > limit:
        print(f"ci: the test suite's peak RSS {peak / 1e9:.2f} GB is above {limit / 1e9:.1f} GB", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
