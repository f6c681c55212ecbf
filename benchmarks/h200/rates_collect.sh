#!/usr/bin/env bash
# There: wait up to ${1:-560} s for the campaign gpu_session.sh began, then bring back what it has so far
# ($OUT/rates.tar.gz: the run sets, the tune's capacity, campaign.json, table.md, the servers' logs).
set -u
for _ in $(seq "${1:-560}"); do [ -e /root/rates.end ] && break; sleep 1; done
tar -czf "$OUT/rates.tar.gz" -C /root rates session.log h200/spec.yml h200/logs 2>/dev/null
cp /root/session.log "$OUT/" 2>/dev/null
cat /root/rates.end 2>/dev/null || echo "still running"
tail -45 /root/session.log
cat /root/rates/table.md 2>/dev/null
