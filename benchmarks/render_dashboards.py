"""Draw the two Grafana dashboards of provisioner/fleet/dashboards.py from real Prometheus queries, with matplotlib.

No Grafana can run here (Debian does not package it), so this is not a Grafana screenshot: it boots the monitoring
lab (two systemd-nspawn Debian hosts, tests/lab/monitoring.py: Debian's node_exporter and Prometheus, the stand-in
vLLM, the TEST DOUBLE nvidia-smi), applies the spec, drives streaming completions at both instances for a while,
then runs every panel's PromQL targets (variables set as Grafana would: instance qwen-a and its host) through the
lab Prometheus's /api/v1/query_range and draws each panel in the dashboard's grid (gridPos), with its title,
unit and legend. Writes docs/monitoring/dashboard-fleet.png and docs/monitoring/dashboard-instance.png.

usage (root, as the lab tests): VP_LAB_BRIDGE=... VP_LAB_NETWORK=... python -m benchmarks.render_dashboards [--load-seconds 90]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from provisioner.apply.hosts import apply_spec
from provisioner.fleet.dashboards import dashboards, with_variables
from provisioner.spec import load_spec
from tests.doubles.vllm_wheel import build_standin_wheel
from tests.lab.haproxy import repo_hosts
from tests.lab.hosts import Lab
from tests.lab.monitoring import PROMETHEUS_PORT, monitoring_repo, monitoring_spec, stream_completion

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "docs" / "monitoring"
FILES = {"vllm-provision-fleet": "dashboard-fleet.png", "vllm-provision-instance": "dashboard-instance.png"}
RATE_WINDOW = "30s"  # $__rate_interval for a 2 s scrape interval
STEP_S = 2


def prometheus_get(address: str, path: str, **query: str) -> dict:
    url = f"http://{address}:{PROMETHEUS_PORT}/api/v1/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=20) as answer:
        body = json.loads(answer.read())
    if body["status"] != "success":
        raise RuntimeError(f"{path} {query}: {body}")
    return body["data"]


def wait_until_every_target_is_up(address: str, expected: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            active = prometheus_get(address, "targets", state="active")["activeTargets"]
            if len(active) == expected and all(target["health"] == "up" for target in active):
                return
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError("not every target came up")


def drive_load(addresses: list[str], seconds: float, clients_per_instance: int = 3) -> int:
    """Streaming completions at every instance from a few clients each, for `seconds`; how many were sent."""
    sent = [0]
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def client(address: str, index: int) -> None:
        while time.monotonic() < stop:
            stream_completion(address, 16 + 16 * index)
            with lock:
                sent[0] += 1
    threads = [threading.Thread(target=client, args=(address, index))
               for address in addresses for index in range(clients_per_instance)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sent[0]


# --------------------------------------------------------------------------- drawing


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda match: labels.get(match.group(1), ""), template) or str(labels)


UNIT_SCALES = {"percentunit": (100, "%"), "s": (1000, "ms"), "watt": (1, "W"), "celsius": (1, "°C"),
               "hertz": (1e-6, "MHz"), "short": (1, "")}


def panel_series(address: str, panel: dict, start: float, end: float, instance: str, host: str) -> list[tuple]:
    """[(legend, [times], [values])] of every target of the panel over [start, end]."""
    found = []
    for target in panel["targets"]:
        query = with_variables(target["expr"], instance, host, RATE_WINDOW)
        result = prometheus_get(address, "query_range", query=query, start=f"{start:.0f}", end=f"{end:.0f}",
                                step=str(STEP_S))["result"]
        for series in result:
            times = [float(at) - start for at, _ in series["values"]]
            values = [float(value) for _, value in series["values"]]
            found.append((legend(target.get("legendFormat", ""), series["metric"]), times, values))
    return found


def draw_panel(axes, panel: dict, series: list[tuple]) -> None:
    import matplotlib.ticker as ticker

    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    scale, suffix = UNIT_SCALES.get(unit, (1, unit))
    axes.set_title(panel["title"] + (f" ({suffix})" if suffix else ""), fontsize=9, loc="left")
    axes.tick_params(labelsize=7)
    if not series:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes, color="grey")
        axes.set_xticks([])
        axes.set_yticks([])
        return
    if panel["type"] in ("stat", "table"):  # the latest value of each series, as Grafana's stat and table show them
        axes.axis("off")
        rows = [f"{name}: {values[-1] * scale:g}{suffix}" for name, _, values in series][:8]
        axes.text(0.02, 0.9, "\n".join(rows), va="top", ha="left", fontsize=8, family="monospace",
                  transform=axes.transAxes)
        return
    for name, times, values in series:
        axes.plot(times, [value * scale for value in values], label=name, linewidth=1.2)
    maximum = panel["fieldConfig"]["defaults"].get("max")
    if maximum is not None:
        axes.set_ylim(0, maximum * scale * 1.05)
    axes.set_xlabel("seconds since the load started", fontsize=7)
    axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=6, loc="upper left")


def draw_dashboard(board: dict, panels: list[tuple[dict, list[tuple]]], path: Path, caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(panel["gridPos"]["y"] + panel["gridPos"]["h"] for panel, _ in panels)
    inches = rows * 0.3 + 1
    figure = plt.figure(figsize=(16, inches))
    figure.suptitle(f"{board['title']}: {caption}", fontsize=11, x=0.01, ha="left")
    top, height = 1 - 0.6 / inches, 1 - 0.7 / inches
    below, above = 0.5 / inches, 0.3 / inches  # room for the x axis's labels, and for the title
    for panel, series in panels:
        grid = panel["gridPos"]
        left = grid["x"] / 24 + 0.035
        width = grid["w"] / 24 - 0.06
        bottom = top - (grid["y"] + grid["h"]) / rows * height + below
        axes = figure.add_axes((left, bottom, width, grid["h"] / rows * height - below - above))
        draw_panel(axes, panel, series)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-seconds", type=float, default=90)
    args = parser.parse_args()
    with Lab() as lab, repo_hosts(lab, monitoring_repo(), "mon") as (one, two), \
            tempfile.TemporaryDirectory() as folder:
        wheelhouse = build_standin_wheel("0.25.0", Path(folder) / "standin-wheelhouse").parent
        spec_path = Path(folder) / "spec.yml"
        spec_path.write_text(yaml.safe_dump(monitoring_spec(one, two, wheelhouse), sort_keys=False))
        applied = apply_spec(load_spec(spec_path))
        if not applied.succeeded:
            raise SystemExit(f"apply failed: {applied.problems}")
        wait_until_every_target_is_up(one.address, expected=4)
        start = time.time() - 10
        sent = drive_load([one.address, two.address], args.load_seconds)
        time.sleep(4)  # the last scrape
        end = time.time()
        caption = (f"matplotlib from the lab Prometheus's query_range ({sent} streamed completions over "
                   f"{args.load_seconds:g} s; instance qwen-a on {one.name}); not Grafana")
        for uid, board in ((board["uid"], board) for board in dashboards().values()):
            panels = [(panel, panel_series(one.address, panel, start, end, "qwen-a", one.name))
                      for panel in board["panels"]]
            empty = [panel["title"] for panel, series in panels if not series]
            draw_dashboard(board, panels, OUT_DIR / FILES[uid], caption)
            print(f"{OUT_DIR / FILES[uid]}: {len(panels)} panels, {sum(len(s) for _, s in panels)} series, "
                  f"empty: {empty or 'none'}")


if __name__ == "__main__":
    main()
