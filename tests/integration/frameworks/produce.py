"""``python -m frameworks.produce celery|dramatiq COUNT SENT``: sends COUNT
tasks with the framework's own call (``delay()``, ``send()``), task ``n``
failing when ``n % 100 == 7``, and appends ``sent n`` to SENT for each
call that returned (``refused n <error>`` for one that raised). With
``PACE`` (tasks per second) in the environment, no faster than that."""

import importlib
import os
import sys
import time


def main(framework: str, count: int, sent_path: str) -> None:
    app = importlib.import_module(f"frameworks.{framework}_app")
    fd = os.open(sent_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pace = float(os.environ.get("PACE", "0"))
    start = time.monotonic()
    for n in range(count):
        if pace > 0 and (ahead := start + n / pace - time.monotonic()) > 0:
            time.sleep(ahead)
        try:
            app.send(n, n % 100 == 7)
        except Exception as e:
            os.write(fd, f"refused {n} {type(e).__name__}: {e}\n".encode())
        else:
            os.write(fd, f"sent {n}\n".encode())
    os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
