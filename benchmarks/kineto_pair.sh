#!/bin/bash
# Paired rounds of the Kineto reader against another tree: the floor (zcat for .gz, cat otherwise),
# then `analyze FILE --json /dev/null` with BASE_SRC and with this tree's src, one line per run
# (wall, user, system, peak RSS, load before). Usage:
#   bash benchmarks/kineto_pair.sh BASE_SRC ROUNDS FILE...
# e.g. git worktree add /tmp/base <commit>; bash benchmarks/kineto_pair.sh /tmp/base/src 2 k1g.json.gz k1g.json
set -u
base=$1; rounds=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)/src
for r in $(seq "$rounds"); do
  for f in "$@"; do
    case $f in *.gz) floor="zcat";; *) floor="cat";; esac
    /usr/bin/time -f "r$r $(basename "$f") $floor %e s wall %U u %S s" sh -c "$floor '$f' > /dev/null"
    for side in base new; do
      if [ $side = base ]; then pp=$base; else pp=$here; fi
      load=$(cut -d' ' -f1 /proc/loadavg)
      PYTHONPATH=$pp /usr/bin/time -f "r$r $(basename "$f") $side %e s wall %U u %S s %M KB load $load" \
        python3 -m tracestory.cli analyze "$f" --json /dev/null > /dev/null
    done
  done
done
