"""Open a page in headless Chromium and record what a person's browser console would show.

Chromium speaks the DevTools protocol over two pipes (--remote-debugging-pipe: it reads commands from fd 3 and writes
replies and events to fd 4, each message JSON ended by a NUL byte), so no websocket client and no driver are needed.
Recorded: console errors and warnings (Runtime.consoleAPICalled), uncaught exceptions (Runtime.exceptionThrown),
browser log entries such as CSP violations and failed loads (Log.entryAdded), every network request
(Network.requestWillBeSent) and every failed load (Network.loadingFailed); then the state of every <img>.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--no-default-browser-check"]
IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({
  alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
  scheme: i.src.split(':')[0], bytes: i.src.length})))"""


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageReport:
    console: list[dict] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log: list[dict] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    title: str = ""
    values: dict = field(default_factory=dict)  # what each of open_page's expressions evaluated to

    @property
    def errors(self) -> list[str]:
        """Everything a console would show as an error or warning."""
        out = [f"console.{c['type']}: {c['text']}" for c in self.console if c["type"] in ("error", "warning", "assert")]
        out += [f"exception: {e}" for e in self.exceptions]
        out += [f"log {e['level']} ({e['source']}): {e['text']}"
                for e in self.log if e["level"] in ("error", "warning")]
        out += [f"failed load: {f}" for f in self.failed]
        return out

    @property
    def network(self) -> list[str]:
        """Requests that would leave the machine (anything but the page itself and data: URLs)."""
        return [u for u in self.requests if not u.startswith(("file:", "data:", "about:"))]


class _Pipe:
    def __init__(self, binary: str, user_data_dir: str, env: dict | None = None):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        command = [binary, *FLAGS, f"--user-data-dir={user_data_dir}", "--remote-debugging-pipe", "about:blank"]
        script = f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}'
        self.process = subprocess.Popen(["bash", "-c", script, "chromium", *command],
                                        pass_fds=(to_chrome_r, from_chrome_w),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            for reply in self._read(deadline):
                if reply.get("id") == self._next:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            self.events.extend(self._read(deadline))

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.extend(self._read(deadline))
        except TimeoutError:
            pass

    def _read(self, deadline: float) -> list[dict]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from chromium")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    err = self.process.stderr.read().decode(errors="replace")[-2000:] if self.process.stderr else ""
                    raise RuntimeError(f"chromium closed the pipe: {err}")
                self._buffer += chunk
        *messages, self._buffer = self._buffer.split(b"\0")
        return [json.loads(m) for m in messages if m]

    def close(self) -> None:
        try:
            os.write(self._to_chrome, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass


def open_page(url: str, binary: str | None = None, settle: float = 1.0, timeout: float = 60, env: dict | None = None,
              expressions: dict[str, str] | None = None) -> PageReport:
    """Load url in a fresh headless Chromium profile and report console, network and images; env: Chromium's
    environment (FONTCONFIG_FILE: the fonts it may use); expressions: JavaScript to evaluate in the page, by name
    (their values in PageReport.values)."""
    binary = binary or chromium_binary()
    if binary is None:
        raise FileNotFoundError("no chromium binary on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="amprepro-chromium-") as profile:
        pipe = _Pipe(binary, profile, env)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Page.navigate", {"url": url}, session=session)
            pipe.wait_event("Page.loadEventFired", timeout=timeout)
            pipe.pump(settle)
            images = pipe.send("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True}, session=session)
            title = pipe.send("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                              session=session)
            report = PageReport(images=json.loads(images["result"]["value"]), title=title["result"]["value"])
            for name, expression in (expressions or {}).items():
                report.values[name] = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                                session=session)["result"].get("value")
            for event in pipe.events:
                method, params = event.get("method"), event.get("params", {})
                if method == "Runtime.consoleAPICalled":
                    text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                    report.console.append({"type": params.get("type"), "text": text})
                elif method == "Runtime.exceptionThrown":
                    details = params.get("exceptionDetails", {})
                    report.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
                elif method == "Log.entryAdded":
                    entry = params.get("entry", {})
                    report.log.append({"level": entry.get("level"), "source": entry.get("source"),
                                       "text": entry.get("text", "")})
                elif method == "Network.requestWillBeSent":
                    report.requests.append(params.get("request", {}).get("url", ""))
                elif method == "Network.loadingFailed":
                    report.failed.append(f"{params.get('errorText')} ({params.get('blockedReason') or ''})")
            return report
        finally:
            pipe.close()


def dump_dom(url: str, binary: str | None = None, timeout: float = 60) -> str:
    """The DOM after load, as chromium --headless --dump-dom prints it."""
    binary = binary or chromium_binary()
    with tempfile.TemporaryDirectory(prefix="amprepro-chromium-") as profile:
        result = subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                                capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"chromium --dump-dom failed ({result.returncode}): {result.stderr[-2000:]}")
    return result.stdout


LAYOUT_JS = """JSON.stringify((() => {
  const wraps = Array.from(document.querySelectorAll('.table-wrap')).map(w => ({
    table: (w.querySelector('table') || {}).className || '', overflow: w.scrollWidth - w.clientWidth}));
  const reason = Array.from(document.querySelectorAll('table.results th'))
    .find(th => th.textContent.trim() === 'reason');
  const marks = Array.from(document.querySelectorAll('h2, table, img, ul, .banner'));
  const sections = Array.from(document.querySelectorAll('h2')).map(h => {
    let content = 0;
    for (let i = marks.indexOf(h) + 1; i < marks.length && marks[i].tagName !== 'H2'; i++) content++;
    const empty = h.closest('.section-empty');
    return {title: h.textContent.replace('\\u00b6', '').trim(), collapsed: !!empty, content: content,
            why: empty ? (empty.querySelector('.why') || {}).textContent || '' : '',
            height: empty ? empty.getBoundingClientRect().height : null};
  });
  return {scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth, wraps: wraps,
          reasonRight: reason ? reason.getBoundingClientRect().right : null, sections: sections};
})())"""


def page_layout(url: str, binary: str | None = None, width: int = 1400, height: int = 900,
                timeout: float = 60) -> dict:
    """The page laid out in a window `width` CSS pixels wide: the document's and every table wrapper's sideways
    overflow, the right edge of the results table's reason header, and each h2 section with how much it shows (tables,
    images, lists, banners before the next h2) or, collapsed, why not."""
    binary = binary or chromium_binary()
    with tempfile.TemporaryDirectory(prefix="amprepro-chromium-") as profile:
        pipe = _Pipe(binary, profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            pipe.send("Page.enable", session=session)
            pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                             "deviceScaleFactor": 1, "mobile": False}, session=session)
            pipe.send("Page.navigate", {"url": url}, session=session)
            pipe.wait_event("Page.loadEventFired", timeout=timeout)
            pipe.pump(0.5)
            found = pipe.send("Runtime.evaluate", {"expression": LAYOUT_JS, "returnByValue": True}, session=session)
            return json.loads(found["result"]["value"])
        finally:
            pipe.close()


# Whether the page's Chinese text falls back to boxes: a CJK character drawn in the report's own font stack paints the
# same pixels as a private-use character no font has (the missing-glyph box), only where no CJK font is found.
CJK_BOXES_JS = """(() => {
  const canvas = document.createElement('canvas'); canvas.width = 48; canvas.height = 48;
  const pen = canvas.getContext('2d');
  const family = getComputedStyle(document.querySelector('.zh') || document.body).fontFamily;
  const paint = ch => { pen.clearRect(0, 0, 48, 48); pen.font = '32px ' + family; pen.fillText(ch, 4, 36);
                        return Array.from(pen.getImageData(0, 0, 48, 48).data).join(','); };
  return paint('\\u6df7') === paint('\\ue000');
})()"""


def fonts_without_cjk(folder) -> dict:
    """An environment whose fontconfig knows only DejaVu (Debian's fonts-dejavu-core, which .ci/setup installs with
    chromium): Chromium then has no CJK font, as on a machine where the articles' text showed as boxes."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "fonts.conf"
    conf.write_text('<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
                    "  <dir>/usr/share/fonts/truetype/dejavu</dir>\n"
                    f"  <cachedir>{folder / 'cache'}</cachedir>\n</fontconfig>\n")
    return {**os.environ, "FONTCONFIG_FILE": str(conf)}
