#!/usr/bin/env bash
# There, one session's GPU work as one job that outlives the calls (the machine stays warm 30 s between them):
#   call 1 (carry .h200/c1): bash tests/fixtures/gpu/h200-audit/setup.sh
#   call 2 (carry .h200/c2): bash benchmarks/h200/gpu_session.sh   (this: starts the job, waits for the audit)
#   call 3 and on:           bash benchmarks/h200/rates_collect.sh  (waits for the rest, brings it back)
# The job: unpack gpu-lab's vLLM; start the instances of benchmarks/h200/rates.py as their units would; audit the
# machine over SSH as a bastion would and record what it answered, for the replay test (tests/fixtures/gpu/
# h200-audit/audit_and_record.sh, into /root/audit-out; SKIP_AUDIT=1 leaves it out); then the profiles against
# vLLM's defaults at request rates and the capacity check (`rates campaign`, into /root/rates). It runs from a copy of this checkout (/root/repo): a later call's fresh tree cannot move under it.
set -u
export PYTHONUNBUFFERED=1
rm -rf /root/repo /root/audit-out /root/rates /root/h200 /root/*.end /root/session.log
mkdir -p /root/repo /root/audit-out /root/rates /root/stage
tar -c --exclude=./.h200 . | tar -x -C /root/repo
if [ ! -d /root/stage/stage/site ]; then
  cat /root/stage/chunk.aa .h200/c2/chunk.a* | xz -dc -T8 | tar -x -C /root/stage || exit 1
fi
cd /root/repo || exit 1
(setsid nohup bash -c '
  export PYTHONPATH=/root/repo:/tmp/site
  python3 -m benchmarks.h200.rates serve || { echo "exit $?" >/root/audit.end; echo "serve failed" >/root/rates.end; exit; }
  [ -n "${SKIP_AUDIT:-}" ] || OUT=/root/audit-out bash tests/fixtures/gpu/h200-audit/audit_and_record.sh \
    >/root/audit-out/stdout.txt 2>&1
  echo "exit $?" >/root/audit.end
  python3 -m benchmarks.h200.rates campaign /root/rates
  echo "exit $?" >/root/rates.end' </dev/null >/root/session.log 2>&1 &)
for _ in $(seq 400); do [ -e /root/audit.end ] && break; sleep 1; done
tar -czf "$OUT/audit-out.tar.gz" -C /root audit-out
cat /root/audit.end 2>/dev/null || echo "audit still running"
cat /root/audit-out/run.log 2>/dev/null
exec bash benchmarks/h200/rates_collect.sh "${1:-100}"
