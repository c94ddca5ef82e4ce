"""The report's figures drawn to PNG in parallel: the notebook builds each figure, worker processes draw them.

Drawing (the layout, the text, the rasterising) is most of the report's time: on the paper preset's results of a
fresh H200 (04ad031), 8 of its 12 s on 2 cores here. With more than one worker (the report rule's threads),
`Display` sends each figure, pickled, to a worker process and shows its section at once with a token where the image
goes; `finish` (the notebook's last cell) puts every PNG in place, updating those outputs where they are
(update_display_data), so the executed notebook and the HTML are what a serial run writes. One worker draws in the
kernel, as before.

The workers are plain child processes (`python -m amprepro.report.figurepool --worker`) that talk over their own
pipes, and end when their stdin closes. Not a multiprocessing pool: its forkserver or resource tracker outlives the
pool holding the kernel's captured stdout, and the kernel's shutdown then waited 2.4 s for it in most runs here,
until jupyter_client terminated it. A worker that dies leaves its figures to the kernel; a figure that fails to draw
fails the report, with the worker's traceback, as it would in the kernel; what drawing warns about is warned again
in the kernel, whose stderr the report moves to its log.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import queue
import re
import struct
import subprocess
import sys
import threading
import traceback
import warnings

TOKEN = re.compile(r"amprepro-figure-(\d+)-pending")
WORKERS = re.compile(r"[1-9][0-9]{0,2}")
FRAME = struct.Struct("!QBQ")  # figure index, status (0 drawn, 1 failed), payload length (a pickle, or JSON back)
MAX_FRAME = 1 << 30  # a base64 PNG of the report is under 5 MB
ACTIVE: FigurePool | None = None  # the notebook's pool while it runs; None: figures are drawn where they are made


def png_bytes(fig) -> bytes:
    """The figure as PNG, closed afterwards (a report draws a dozen)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def png_base64(fig) -> str:
    """The figure as base64 PNG, what the HTML embeds."""
    return base64.b64encode(png_bytes(fig)).decode("ascii")


def draw(blob: bytes) -> str:
    """A pickled (rcParams, figure) as base64 PNG, drawn under the kernel's rcParams (some are read only when a figure
    is drawn), in a worker, or in the kernel where a worker died."""
    import matplotlib

    rc, fig = pickle.loads(blob)
    with matplotlib.rc_context(rc):
        return png_base64(fig)


def embed(fig) -> str:
    """What goes after data:image/png;base64, in the HTML: the PNG, or a token the pool's PNG replaces."""
    if ACTIVE is None:
        return png_base64(fig)
    return ACTIVE.submit(fig)


def workers_of(value) -> int:
    """The notebook parameter `workers` (papermill passes a string): a count from 1 to 999, checked by pattern."""
    text = str(value).strip()
    if not WORKERS.fullmatch(text):
        raise ValueError(f"report parameter workers={value!r} is not a whole number from 1 to 999")
    return int(text)


def read_exactly(stream, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


class Worker:
    """One drawing process, a thread that feeds it (a figure's pickle is larger than a pipe holds, and the kernel must
    not wait while the worker draws) and a thread that reads what it sends back."""

    def __init__(self, results: dict, ready: threading.Condition):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-m", "amprepro.report.figurepool", "--worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        env=env)
        self.results, self.ready, self.alive = results, ready, True
        self.queue: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self.write, daemon=True),
                        threading.Thread(target=self.read, daemon=True)]
        for thread in self.threads:
            thread.start()

    def send(self, index: int, blob: bytes) -> None:
        self.queue.put(FRAME.pack(index, 0, len(blob)) + blob)

    def write(self) -> None:
        stdin = self.process.stdin
        try:
            while (frame := self.queue.get()) is not None:
                stdin.write(frame)
                stdin.flush()
        except OSError:  # the worker died: read() sees its end, and the kernel draws what it did not
            pass
        finally:
            try:
                stdin.close()
            except OSError:
                pass

    def read(self) -> None:
        out = self.process.stdout
        try:
            while (header := read_exactly(out, FRAME.size)) is not None:
                index, status, size = FRAME.unpack(header)
                if size > MAX_FRAME or status not in (0, 1):  # not our protocol: this worker is ended
                    self.process.kill()
                    break
                payload = read_exactly(out, size)
                if payload is None:
                    break
                with self.ready:
                    self.results[index] = (status, payload)
                    self.ready.notify_all()
        finally:  # whatever ended the reading, nobody waits on this worker any more
            with self.ready:
                self.alive = False
                self.ready.notify_all()

    def close(self) -> None:
        self.queue.put(None)  # the worker ends when its stdin closes
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for thread in self.threads:
            thread.join()


class FigurePool:
    """Figures in flight: each pickled (the figure is closed here), sent to a worker in turn, drawn there."""

    def __init__(self, workers: int):
        self.results: dict[int, tuple[int, bytes]] = {}
        self.ready = threading.Condition()
        self.workers = [Worker(self.results, self.ready) for _ in range(workers)]
        self.blobs: list[bytes] = []
        self.sent_to: list[Worker] = []

    def submit(self, fig) -> str:
        import matplotlib.pyplot as plt

        blob = pickle.dumps((dict(plt.rcParams), fig))
        plt.close(fig)
        index = len(self.blobs)
        self.blobs.append(blob)
        worker = self.workers[index % len(self.workers)]
        worker.send(index, blob)
        self.sent_to.append(worker)
        return f"amprepro-figure-{index}-pending"

    def png(self, index: int) -> str:
        worker = self.sent_to[index]
        with self.ready:
            while index not in self.results and worker.alive:
                self.ready.wait()
            status, payload = self.results.get(index, (None, b""))
        if status is None:  # its worker ended before drawing it
            warnings.warn(f"figure {index}: its drawing process ended (exit {worker.process.poll()}); drawn in the "
                          "kernel", RuntimeWarning, stacklevel=2)
            return draw(self.blobs[index])
        answer = json.loads(payload)
        for text in answer["warnings"]:  # what drawing it warned about, where the serial run warned: the notebook
            warnings.warn(text, RuntimeWarning, stacklevel=2)
        if status == 1:
            raise RuntimeError(f"figure {index} could not be drawn:\n{answer['error']}")
        return answer["png"]

    def resolve(self, html: str) -> str:
        return TOKEN.sub(lambda m: self.png(int(m.group(1))), html)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


def serve(stdin, stdout) -> None:
    """A worker's loop until stdin closes: a pickled figure in; out, its base64 PNG or the traceback of why not, with
    what drawing it warned about."""
    import matplotlib

    matplotlib.use("Agg")
    while (header := read_exactly(stdin, FRAME.size)) is not None:
        index, _, size = FRAME.unpack(header)
        blob = read_exactly(stdin, size)
        if blob is None:
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                status, answer = 0, {"png": draw(blob)}
            except Exception:
                status, answer = 1, {"error": traceback.format_exc()}
        answer["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        payload = json.dumps(answer).encode()
        stdout.write(FRAME.pack(index, status, len(payload)) + payload)
        stdout.flush()


class Display:
    """The notebook's display(HTML(...)): with workers > 1 a section that holds pending figures is shown with a
    display id and updated in place by finish()."""

    def __init__(self, workers=1):
        global ACTIVE
        self.pending: list[tuple] = []
        count = workers_of(workers)
        self.pool = FigurePool(count) if count > 1 else None
        ACTIVE = self.pool
        print(f"report: figures drawn by {count} worker processes" if count > 1 else "report: figures drawn in the "
              "kernel", file=sys.stderr)  # into the job log (amprepro.report.render)

    def __call__(self, html: str) -> None:
        from IPython.display import HTML, display

        if self.pool is not None and TOKEN.search(html):
            self.pending.append((display(HTML(html), display_id=True), html))
        else:
            display(HTML(html))

    def finish(self) -> None:
        """Every pending figure in place; the workers ended."""
        global ACTIVE
        from IPython.display import HTML

        try:
            for handle, html in self.pending:
                handle.update(HTML(self.pool.resolve(html)))
        finally:
            ACTIVE = None
            if self.pool is not None:
                self.pool.close()


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        raise SystemExit("python -m amprepro.report.figurepool --worker: draws pickled figures from stdin")
    protocol = os.fdopen(os.dup(1), "wb")  # the frames' own descriptor: whatever else prints to fd 1 goes elsewhere
    os.dup2(2, 1)
    serve(sys.stdin.buffer, protocol)
