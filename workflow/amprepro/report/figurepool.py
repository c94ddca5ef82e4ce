"""The report's figures drawn to PNG in parallel: the notebook builds each figure, worker processes draw them.

Drawing (the layout, the text, the rasterising) is most of the report's time: on the paper preset's results of a
fresh H200 (04ad031), 8 of its 12 s on 2 cores here. With more than one worker (the report rule's threads),
`Display` sends each figure, pickled, to a process pool and shows its section at once with a token where the image
goes; `finish` (the notebook's last cell) puts every PNG in place, updating those outputs where they are
(update_display_data), so the executed notebook and the HTML are what a serial run writes. One worker draws in
the kernel, as before. A pool that breaks (a worker killed) draws what is left in the kernel; a figure that fails to
draw fails the report, as it would in the kernel.
"""

from __future__ import annotations

import base64
import multiprocessing
import pickle
import re
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from amprepro.report.reportcharts import png_bytes

TOKEN = re.compile(r"amprepro-figure-(\d+)-pending")
WORKERS = re.compile(r"[1-9][0-9]{0,2}")
ACTIVE: FigurePool | None = None  # the notebook's pool while it runs; None: figures are drawn where they are made


def draw(blob: bytes) -> str:
    """A pickled figure as base64 PNG (in a worker, or in the kernel where the pool broke)."""
    return base64.b64encode(png_bytes(pickle.loads(blob))).decode("ascii")


def embed(fig) -> str:
    """What goes after data:image/png;base64, in the HTML: the PNG, or a token the pool's PNG replaces."""
    if ACTIVE is None:
        return base64.b64encode(png_bytes(fig)).decode("ascii")
    return ACTIVE.submit(fig)


def workers_of(value) -> int:
    """The notebook parameter `workers` (papermill passes a string): a count from 1 to 999, checked by pattern."""
    text = str(value).strip()
    if not WORKERS.fullmatch(text):
        raise ValueError(f"report parameter workers={value!r} is not a whole number from 1 to 999")
    return int(text)


class FigurePool:
    """Figures in flight: each pickled (the figure is closed here) and drawn by a forkserver worker."""

    def __init__(self, workers: int):
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["amprepro.report.figurepool"])  # matplotlib and pandas imported once
        self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=context)
        self.blobs: list[bytes] = []
        self.futures: list = []

    def submit(self, fig) -> str:
        import matplotlib.pyplot as plt

        blob = pickle.dumps(fig)
        plt.close(fig)
        self.blobs.append(blob)
        try:
            self.futures.append(self.executor.submit(draw, blob))
        except BrokenProcessPool:  # a worker died earlier: this one is drawn in the kernel when resolved
            self.futures.append(None)
        return f"amprepro-figure-{len(self.blobs) - 1}-pending"

    def png(self, index: int) -> str:
        future = self.futures[index]
        try:
            if future is not None:
                return future.result()
        except BrokenProcessPool:  # a worker died (not the figure's fault): draw it here
            pass
        return draw(self.blobs[index])

    def resolve(self, html: str) -> str:
        return TOKEN.sub(lambda m: self.png(int(m.group(1))), html)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


class Display:
    """The notebook's display(HTML(...)): with workers > 1 a section that holds pending figures is shown with a
    display id and updated in place by finish()."""

    def __init__(self, workers=1):
        global ACTIVE
        self.pending: list[tuple] = []
        self.pool = FigurePool(workers_of(workers)) if workers_of(workers) > 1 else None
        ACTIVE = self.pool

    def __call__(self, html: str) -> None:
        from IPython.display import HTML, display

        if self.pool is not None and TOKEN.search(html):
            self.pending.append((display(HTML(html), display_id=True), html))
        else:
            display(HTML(html))

    def finish(self) -> None:
        """Every pending figure in place; the pool shut down."""
        global ACTIVE
        from IPython.display import HTML

        try:
            for handle, html in self.pending:
                handle.update(HTML(self.pool.resolve(html)))
        finally:
            ACTIVE = None
            if self.pool is not None:
                self.pool.close()
