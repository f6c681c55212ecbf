#!/usr/bin/env bash
# There (a call of its own, on a machine where gpu-lab's bundle is unpacked in /root/stage and the controller's
# wheels in /tmp/site: tests/fixtures/gpu/h200-audit's two calls leave it so): stop every vLLM left running,
# copy this checkout to /root/repo, and run `rates serve` then `rates campaign /root/rates` in a session of
# their own, which outlives the call; wait for it up to ${1:-550} s. Then benchmarks/h200/rates_collect.sh.
set -u
export PYTHONUNBUFFERED=1
pkill -9 -f '[v]llm|[V]LLM'
for _ in $(seq 60); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 1; done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
rm -rf /root/repo /root/rates /root/h200 /root/rates.log /root/rates.end && mkdir -p /root/repo /root/rates
tar -c --exclude=./.h200 . | tar -x -C /root/repo
cd /root/repo || exit 1
(PYTHONPATH=/root/repo:/tmp/site setsid nohup bash -c 'python3 -m benchmarks.h200.rates serve &&
  python3 -m benchmarks.h200.rates campaign /root/rates; echo "exit $?" >/root/rates.end' </dev/null >/root/rates.log 2>&1 &)
exec bash benchmarks/h200/rates_collect.sh "${1:-550}"
