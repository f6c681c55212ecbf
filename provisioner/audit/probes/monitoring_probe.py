"""Runs ON THE AUDITED HOST (python3 - EXPORTER_URL [PROMETHEUS_URL]; standard library only).

Asks node_exporter for its /metrics (from the host itself) and prints, as JSON, whether it answered and the
GPU timer's nvsmi_up and the age of nvsmi_timestamp_seconds when it writes them; on the monitoring host also
Prometheus's active targets (/api/v1/targets): [job, instance, health, lastError] each.
"""
import json
import sys
import time
import urllib.request


def fetch(url):
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode("utf-8", "replace")


def exporter(url):
    try:
        text = fetch(url)
    except Exception as error:  # refused, timed out, an HTTP error: said as it is
        return {"error": str(getattr(error, "reason", None) or error)}
    found = {"answers": True}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "nvsmi_up":
            found["nvsmi_up"] = float(value)
        elif name == "nvsmi_timestamp_seconds":
            found["nvsmi_age_s"] = round(time.time() - float(value), 1)
    return found


def prometheus(url):
    try:
        targets = json.loads(fetch(url))["data"]["activeTargets"]
    except Exception as error:
        return {"error": str(getattr(error, "reason", None) or error)}
    return {"targets": [[target["labels"].get("job"), target["labels"].get("instance"), target["health"],
                         target.get("lastError", "")] for target in targets]}


def main():
    answer = {"exporter": exporter(sys.argv[1])}
    if len(sys.argv) > 2:
        answer["prometheus"] = prometheus(sys.argv[2])
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
