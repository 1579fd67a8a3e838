"""The stock ``e2b-code-interpreter`` SDK against shoald: ``run_code`` and
code contexts on the daemon's ``code-interpreter-v1`` template (built by
the daemon on first use: the base image with the ``code-interpreter``
layer, our interpreter server started before the snapshot), and the
sandbox-port relay with a small server in the guest.

One sandbox for the module (a template build and a restore are what cost
time under PVM); each test leaves it as it found it."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.code_interpreter


@pytest.fixture(scope="module")
def sbx(daemon):
    from e2b_code_interpreter import Sandbox

    if daemon.interp_warmup is not None and (err := daemon.interp_warmup.wait()):
        print(f"the session's warm-up create of code-interpreter-v1 failed: {err}")

    # The first create of code-interpreter-v1 builds the template.
    s = Sandbox.create(timeout=3600, request_timeout=2400, envs={"FROM_CREATE": "created"})
    try:
        yield s
    finally:
        s.kill()


def test_state_persists_across_calls(sbx):
    ex = sbx.run_code("x = 41")
    assert ex.error is None, ex.error
    ex = sbx.run_code("x + 1")
    assert ex.text == "42"
    assert [r.is_main_result for r in ex.results] == [True]


def test_envs_of_the_sandbox_and_of_the_call(sbx):
    ex = sbx.run_code("import os\nos.environ.get('FROM_CREATE')")
    assert ex.text == "'created'"
    ex = sbx.run_code("os.environ.get('PER_CALL')", envs={"PER_CALL": "call"})
    assert ex.text == "'call'"
    ex = sbx.run_code("os.environ.get('PER_CALL')")
    assert ex.text is None  # only for that call


def test_printed_line_is_stdout(sbx):
    seen = []
    ex = sbx.run_code("print('hello')", on_stdout=lambda m: seen.append(m.line))
    assert ex.logs.stdout == ["hello\n"]
    assert seen == ["hello\n"]
    assert ex.logs.stderr == []
    assert ex.text is None


def test_exception_has_name_value_and_traceback(sbx):
    ex = sbx.run_code("def f():\n    return 1 / 0\nf()")
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    assert "ZeroDivisionError" in ex.error.traceback
    assert "f()" in ex.error.traceback


def test_plot_returns_png(sbx):
    ex = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.title('squares')\n"
        "plt.show()"
    )
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1, ex.results
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")


def test_dataframe_has_html(sbx):
    ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert ex.error is None, ex.error
    assert "<table" in (ex.results[0].html or "")
    assert "a" in ex.text


def test_bash(sbx):
    ex = sbx.run_code("echo hi; N=3", language="bash")
    assert ex.logs.stdout == ["hi\n"]
    ex = sbx.run_code("echo $((N * 2))", language="bash")
    assert ex.logs.stdout == ["6\n"]
    ex = sbx.run_code("false", language="bash")
    assert ex.error is not None


def test_contexts(sbx):
    ctx = sbx.create_code_context(cwd="/tmp", language="python")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    ex = sbx.run_code("import os\nos.getcwd()", context=ctx)
    assert ex.text == "'/tmp'"
    ex = sbx.run_code("'x' in dir()", context=ctx)
    assert ex.text == "False"  # its own state, not the default context's
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.run_code("z = 1", context=ctx)
    sbx.restart_code_context(ctx)
    ex = sbx.run_code("z", context=ctx)
    assert ex.error is not None and ex.error.name == "NameError"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]


def test_timeout_interrupts_and_keeps_state(sbx):
    from e2b import TimeoutException

    sbx.run_code("kept = 'yes'")
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\nwhile True: time.sleep(0.1)", timeout=3)
    t0 = time.monotonic()
    ex = sbx.run_code("kept")
    assert ex.text == "'yes'"
    assert time.monotonic() - t0 < 30


def _port_request(daemon, sbx, port: int, path: str = "/"):
    req = urllib.request.Request(
        daemon.url + path,
        headers={
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2b-Sandbox-Port": str(port),
            "E2B-Traffic-Access-Token": sbx.traffic_access_token or "",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# A guest HTTP server on port 8080. The guest kernel has no IPv4, so a
# guest service listens on the Unix socket /run/shoal/ports/<port>, which
# is where the agent's relay connects for that port.
GUEST_SERVER = """
import http.server, os, socketserver

class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def address_string(self):
        return "local"

os.makedirs("/run/shoal/ports", exist_ok=True)
path = "/run/shoal/ports/8080"
if os.path.exists(path):
    os.unlink(path)
Server(path, Handler).serve_forever()
"""


def test_port_relay_to_a_guest_server(daemon, sbx):
    ex = sbx.run_code(
        "import subprocess, pathlib\n"
        "pathlib.Path('/tmp/www').mkdir(exist_ok=True)\n"
        "pathlib.Path('/tmp/www/hello.txt').write_text('hello from the guest')\n"
        f"pathlib.Path('/tmp/srv.py').write_text({GUEST_SERVER!r})\n"
        "srv = subprocess.Popen(['python3', '/tmp/srv.py'], cwd='/tmp/www',\n"
        "                       start_new_session=True,\n"
        "                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    assert ex.error is None, ex.error
    end = time.monotonic() + 120
    while True:
        status, body = _port_request(daemon, sbx, 8080, "/hello.txt")
        if status == 200 or time.monotonic() > end:
            break
        time.sleep(0.5)
    assert (status, body) == (200, b"hello from the guest")
    status, body = _port_request(daemon, sbx, 8081, "/")
    assert status == 502
    assert "port is not open" in json.loads(body)["message"]
    sbx.run_code("srv.kill()")
