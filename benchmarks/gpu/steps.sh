# Sourced by the device scripts: `step NAME SECONDS CMD...` runs CMD under a time limit and
# appends its command line, its last 40 lines of output (torch warnings dropped) and its exit
# code to $LOG.
step() {
    local name=$1 secs=$2; shift 2
    echo "=== [$name] $(date +%T) \$ $*" | tee -a "$LOG"
    timeout "$secs" "$@" 2>&1 | grep -v Warning | tail -40 | tee -a "$LOG"
    echo "=== [$name] rc=${PIPESTATUS[0]} $(date +%T)" | tee -a "$LOG"
}
