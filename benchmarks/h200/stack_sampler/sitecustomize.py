"""Stack sampler for timing a vLLM start (issue 19), loaded only when this folder is on PYTHONPATH and
STACK_SAMPLE_DIR is set: a daemon thread writes every STACK_SAMPLE_S seconds (default 0.2) the stack of
each busy thread of this process to STACK_SAMPLE_DIR/<pid>.txt, one line per thread:
  <unix time>\t<thread name>\t<outermost frame>;...;<innermost frame>
and starts again in a forked child (vLLM forks its EngineCore). Standard library only; measurement aid,
never installed on a product host."""

import os
import sys
import threading
import time

_DIR = os.environ.get("STACK_SAMPLE_DIR")
_IDLE = {"wait", "select", "poll", "_wait_for_tstate_lock", "sleep", "recv", "recv_multipart", "get",
         "_recv", "accept", "epoll", "_run_once", "run_forever", "readline", "recv_into", "_poll", "wait_for"}


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/dist-packages/", "/site/", "/python3.12/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path


def _loop() -> None:
    interval = float(os.environ.get("STACK_SAMPLE_S", "0.2"))
    me = threading.get_ident()
    main = threading.main_thread().ident
    with open(os.path.join(_DIR, f"{os.getpid()}.txt"), "a") as out:
        out.write(f"#\tpid {os.getpid()} ppid {os.getppid()} t0 {time.time():.3f} argv {' '.join(sys.argv[:4])}\n")
        while True:
            time.sleep(interval)
            now = time.time()
            names = {thread.ident: thread.name for thread in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                if ident != main and frame.f_code.co_name in _IDLE:
                    continue
                stack = []
                while frame is not None and len(stack) < 60:
                    stack.append(f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}")
                    frame = frame.f_back
                out.write(f"{now:.3f}\t{'MAIN' if ident == main else names.get(ident, ident)}\t{';'.join(reversed(stack))}\n")
            out.flush()


def _start() -> None:
    threading.Thread(target=_loop, daemon=True, name="stack-sampler").start()


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    _start()
    os.register_at_fork(after_in_child=_start)
