# Copyright: the vllm-provision authors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The event stream `provision apply` reads: one JSON object per line, appended to a file."""

from __future__ import annotations

DOCUMENTATION = r"""
name: provision_events
type: notification
short_description: Write the run's task results and stats as JSON lines, for provision apply
description:
  - Appends one JSON object per event to O(events_file) as it happens (a play's start, each task
    result of each host (a loop's items too) and the final stats). C(provision apply) reads the file while
    the run goes on and turns the events into its live per-task lines, its summary and its run log.
  - Each object has two keys, C(event) and C(event_data); the event is one of C(playbook_on_play_start),
    C(runner_on_ok), C(runner_on_failed), C(runner_on_skipped), C(runner_on_unreachable),
    C(runner_item_on_ok), C(runner_item_on_failed), C(runner_item_on_skipped), C(playbook_on_stats)
    (the names ansible-runner gives them).
  - A no_log result is written as Ansible hands it to every callback, censored (only C(changed) and a few
    status keys kept).
  - C(runner_on_start) says a host began a task; a host that began a task and has no result for it when the run
    ends was cut in the middle of it.
  - Stops the run at a task boundary when O(stop_file) exists (C(provision apply) creates it on the first Ctrl-C or
    SIGTERM). Before the next task starts, unless a handler is notified and has not run yet (a change made
    whose restart would be lost), it writes C(provision_stopped) (the task it stops before) and raises
    KeyboardInterrupt, as Ctrl-C does, while no task runs.
  - Writes nothing when O(events_file) is not set.
requirements:
  - enabled in callbacks_enabled
options:
  events_file:
    description: The file the events are appended to (created if missing).
    type: path
    env:
      - name: PROVISION_EVENTS_FILE
  stop_file:
    description: A file whose existence asks the run to stop at the next task boundary.
    type: path
    env:
      - name: PROVISION_STOP_FILE
"""

import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "vllm_provision.gpu_host.provision_events"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stream = None
        self._stop_file = None
        self._handlers_pending = False  # a changed task notified handlers that have not run yet

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        path = self.get_option("events_file")
        self._stream = open(path, "a", encoding="utf-8") if path else None
        self._stop_file = self.get_option("stop_file")

    def _write(self, event, **data):
        if self._stream is None:
            return
        self._stream.write(json.dumps({"event": event, "event_data": data}, default=str) + "\n")
        self._stream.flush()  # read while the run goes on

    def _result(self, event, result, **extra):
        task = result._task
        role = getattr(task, "_role", None)
        self._write(event, host=result._host.get_name(), task=task.name or task.action,
                    role=role._role_name if role else "", task_action=task.action, task_uuid=str(task._uuid),
                    res=result._result, **extra)

    def _label(self, task):
        role = getattr(task, "_role", None)
        return dict(task=task.name or task.action, role=role._role_name if role else "")

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self._stop_file and os.path.exists(self._stop_file) and not self._handlers_pending:
            self._write("provision_stopped", **self._label(task))
            raise KeyboardInterrupt("stopped at a task boundary")

    # Ansible keeps a notification to itself until the handlers flush (v2_playbook_on_notify comes then): a changed
    # result of a task that notifies is the notification; the handlers' first start, the flush
    def v2_playbook_on_handler_task_start(self, task):
        self._handlers_pending = False

    def v2_runner_on_start(self, host, task):
        self._write("runner_on_start", host=host.get_name(), **self._label(task))

    def v2_playbook_on_play_start(self, play):
        self._handlers_pending = False  # a play's handlers run by its end, or not at all
        self._write("playbook_on_play_start", play=play.get_name().strip())

    def v2_runner_on_ok(self, result):
        self._handlers_pending |= bool(result.is_changed() and result._task.notify)
        self._result("runner_on_ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result("runner_on_failed", result, ignore_errors=ignore_errors)

    def v2_runner_on_skipped(self, result):
        self._result("runner_on_skipped", result)

    def v2_runner_on_unreachable(self, result):
        self._result("runner_on_unreachable", result)

    def v2_runner_item_on_ok(self, result):
        self._result("runner_item_on_ok", result)

    def v2_runner_item_on_failed(self, result):
        self._result("runner_item_on_failed", result)

    def v2_runner_item_on_skipped(self, result):
        self._result("runner_item_on_skipped", result)

    def v2_playbook_on_stats(self, stats):
        counts = {key: getattr(stats, key) for key in ("ok", "changed", "failures", "dark", "skipped", "processed")}
        self._write("playbook_on_stats", **counts)
        self._stream.close() if self._stream is not None else None
