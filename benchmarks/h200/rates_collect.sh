#!/usr/bin/env bash
# There: wait up to ${1:-560} s for the campaign rates_start.sh began, then bring back what it has so far
# ($OUT/rates.tar.gz: the run sets, the tune's capacity, campaign.json, table.md, the servers' logs).
set -u
for _ in $(seq "${1:-560}"); do [ -e /root/rates.end ] && break; sleep 1; done
tar -czf "$OUT/rates.tar.gz" -C /root rates rates.log h200/spec.yml h200/logs 2>/dev/null
cp /root/rates.log "$OUT/" 2>/dev/null
cat /root/rates.end 2>/dev/null || echo "still running"
tail -45 /root/rates.log
cat /root/rates/table.md 2>/dev/null
