"""The report's figures drawn by worker processes (amprepro.report.figurepool): the same PNGs as drawn in the kernel,
every one in its place, a broken pool drawn in the kernel instead, and no report written with a figure missing."""

from __future__ import annotations

import base64
import warnings

import matplotlib.pyplot as plt
import nbformat
import pytest
from report_helpers import GPU, REFERENCE_FAIL, render_fixture
from test_render import charts

from amprepro.report import figurepool, render
from amprepro.report.figurepool import png_bytes


def figure(n: int):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(range(n), [i * i for i in range(n)], label=f"n={n}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the axes, as the report's legends
    fig.set_layout_engine("tight")
    return fig


def test_workers_draw_the_same_png_as_the_kernel():
    serial = [base64.b64encode(png_bytes(figure(n))).decode("ascii") for n in (3, 5, 8)]
    pool = figurepool.FigurePool(2)
    try:
        tokens = [pool.submit(figure(n)) for n in (3, 5, 8)]
        html = " ".join(f'<img src="data:image/png;base64,{t}"/>' for t in tokens)
        assert len(figurepool.TOKEN.findall(html)) == 3
        resolved = pool.resolve(html)
    finally:
        pool.close()
    assert not figurepool.TOKEN.search(resolved)
    assert [s.split(",", 1)[1].split('"')[0] for s in resolved.split("<img")[1:]] == serial


def test_a_dead_worker_leaves_its_figures_to_the_kernel():
    pool = figurepool.FigurePool(1)
    try:
        first = pool.submit(figure(4))
        pool.resolve(first)  # the worker is up
        worker = pool.workers[0]
        worker.process.kill()  # as the OOM killer would
        worker.process.wait()
        worker.threads[1].join(timeout=30)  # its reader saw the end
        assert not worker.alive
        second = pool.submit(figure(6))
        with pytest.warns(RuntimeWarning, match="drawn in the kernel"):
            drawn = pool.resolve(second)
        assert drawn == base64.b64encode(png_bytes(figure(6))).decode("ascii")
    finally:
        pool.close()


def test_a_figure_that_cannot_be_drawn_fails_the_report_with_the_workers_traceback():
    fig = figure(3)
    fig.axes[0].text(0.5, 0.5, r"$\notacommand$")  # mathtext fails when drawn, not when built
    pool = figurepool.FigurePool(2)
    try:
        token = pool.submit(fig)
        with pytest.raises(RuntimeError, match=r"could not be drawn:[\s\S]*ValueError"):
            pool.resolve(token)
        assert pool.resolve(pool.submit(figure(5)))  # the worker draws on
    finally:
        pool.close()


def test_what_drawing_warns_about_is_warned_in_the_kernel():
    fig = plt.figure()
    fig.add_axes([0.1, 0.1, 0.8, 0.8])
    fig.set_layout_engine("tight")  # laid out, and warned about, only when drawn
    pool = figurepool.FigurePool(2)
    try:
        token = pool.submit(fig)
        with pytest.warns(RuntimeWarning, match="UserWarning: This figure includes Axes that are not compatible"):
            pool.resolve(token)
    finally:
        pool.close()


def test_the_workers_end_with_the_pool():
    pool = figurepool.FigurePool(3)
    pool.resolve(pool.submit(figure(3)))
    processes = [worker.process for worker in pool.workers]
    pool.close()
    assert all(process.returncode == 0 for process in processes)


def test_without_a_pool_figures_are_drawn_where_they_are_made():
    assert figurepool.ACTIVE is None
    assert figurepool.embed(figure(3)) == base64.b64encode(png_bytes(figure(3))).decode("ascii")


@pytest.mark.parametrize("value", ["0", "-1", "", "2 ", "8; rm -rf /", "1e3", "1000", "two", None])
def test_workers_parameter_is_a_count_checked_by_pattern(value):
    if value == "2 ":
        assert figurepool.workers_of(value) == 2  # papermill's string, stripped
        return
    with pytest.raises(ValueError, match="workers="):
        figurepool.workers_of(value)


def test_render_refuses_html_with_a_pending_figure(tmp_path):
    assert render.PENDING_FIGURE.pattern == figurepool.TOKEN.pattern.replace("(", "").replace(")", "")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("show(...)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/html": '<img class="chart" alt="x" src="data:image/png;base64,amprepro-figure-0-pending"/>'})]
    nb.cells.append(cell)
    executed = tmp_path / "report.ipynb"
    nbformat.write(nb, executed)
    with pytest.raises(render.RenderError, match="pending"):
        render.to_html(str(executed), str(tmp_path / "report.html"))
    assert not (tmp_path / "report.html").exists()


def test_the_report_with_workers_holds_the_same_charts(gpu_html, tmp_path):
    """The notebook's figures drawn by three workers: the same PNGs, in the same places, as drawn in the kernel."""
    parallel = render_fixture(GPU, tmp_path / "parallel", REFERENCE_FAIL, title="GPU-like fixture", workers=3)
    html = parallel.read_text()
    assert "amprepro-figure-" not in html
    assert charts(html) == charts(gpu_html.read_text())
    assert len(charts(html)) >= 5
    executed = nbformat.writes(nbformat.read(parallel.parent / "report.ipynb", as_version=4))
    assert "amprepro-figure-" not in executed  # the executed notebook too
    assert "report: figures drawn by 3 worker processes" in executed  # the pool ran, not the kernel alone


def test_a_worker_that_prints_cannot_hang_the_report():
    """Whatever a worker prints to its stdout (a library, an unpickled object) stays out of the frames."""
    pool = figurepool.FigurePool(1)
    try:
        fig = figure(3)
        fig.axes[0].loud = Loud()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # drawn by the worker, not left to the kernel
            drawn = pool.resolve(pool.submit(fig))
        assert drawn == base64.b64encode(png_bytes(figure(3))).decode("ascii")
    finally:
        pool.close()


class Loud:
    """Prints when unpickled (in the worker)."""

    def __reduce__(self):
        return (print, ("a stray line on stdout",))
