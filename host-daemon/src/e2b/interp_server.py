#!/usr/bin/env python3
"""Shoal's code interpreter: the HTTP API the `e2b-code-interpreter` SDK
calls on port 49999, with the Python standard library only (no Jupyter).

- POST /execute {code, context_id?, language?, env_vars?}: NDJSON stream of
  {"type": "number_of_executions"}, "stdout"/"stderr" {text, timestamp},
  "result" {text, html, png, ..., is_main_result}, "error" {name, value,
  traceback}, then {"type": "end_of_execution"}.
- POST /contexts {language?, cwd?} -> {id, language, cwd}; GET /contexts;
  DELETE /contexts/{id}; POST /contexts/{id}/restart.
- GET /health: 200 once the default Python context is up (and the modules
  named by SHOAL_CI_WARM are imported in it).

Every context is a process of its own (Python: this file with --worker;
bash: a bash reading commands), stateful across executions. Output the
process or its children write to fds 1 and 2 is streamed as it comes. The
last expression of a Python cell is the main result (its repr as text, and
its _repr_html_/_repr_png_/... formats); matplotlib figures left open are
results with a PNG. When the client goes away (the SDK's timeout closes the
connection) the execution is interrupted (SIGINT to the context's process
group, then SIGKILL and a fresh context if it does not stop).

Run as: interp_server.py [--port 49999] [--host 0.0.0.0] [--unix PATH]
(--port 0: no TCP listener).
"""

import ast
import base64
import codecs
import json
import linecache
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 16 << 20
READ_CHUNK = 64 << 10
# After an interrupt, how long a context has to stop before it is killed.
INTERRUPT_GRACE = 3.0
# How often the interrupt is repeated until the execution ends.
INTERRUPT_REPEAT = 0.25
# Silence after which an execution sends a keepalive line.
KEEPALIVE = 1.0
# Where the sandbox's environment variables may be (JSON object).
ENVS_FILE = os.environ.get("SHOAL_CI_ENVS_FILE", "/run/e2b/envs.json")
LANGS = {"python": "python", "python3": "python", "bash": "bash", "sh": "bash"}
DEFAULT_CWD = "/home/user"
BASH_DONE = "__SHOAL_CI_DONE__"


def now_ns():
    return time.time_ns()


def sandbox_envs():
    try:
        with open(ENVS_FILE) as f:
            v = json.load(f)
        return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}
    except (OSError, ValueError):
        return {}


def default_cwd(cwd):
    for c in (cwd, DEFAULT_CWD, os.environ.get("HOME"), "/"):
        if c and os.path.isdir(c):
            return c
    return "/"


class ContextDied(Exception):
    pass


class Context:
    """One stateful interpreter process."""

    def __init__(self, language, cwd, cid=None):
        self.id = cid or str(uuid.uuid4())
        self.language = language
        self.cwd = default_cwd(cwd)
        self.lock = threading.Lock()
        self.count = 0
        self.proc = None
        self.ctl_r = None  # events from the process (fd 3 there)
        self.cmd_w = None  # commands to the process (fd 4 / stdin there)
        self.start()

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self):
        env = dict(os.environ)
        env.update(sandbox_envs())
        env.setdefault("MPLBACKEND", "Agg")
        env.pop("SHOAL_CI_WARM", None)
        ev_r, ev_w = os.pipe()
        cmd_r, cmd_w = os.pipe()
        # The context finds its pipes by number (no preexec_fn: the server
        # has threads).
        env["SHOAL_CI_EVENTS_FD"] = str(ev_w)
        env["SHOAL_CI_COMMANDS_FD"] = str(cmd_r)
        if self.language == "python":
            argv = [sys.executable, os.path.abspath(__file__), "--worker"]
            stdin = subprocess.DEVNULL
        else:
            argv = ["bash", "--noprofile", "--norc"]
            stdin = cmd_r
        self.proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.cwd,
            env=env,
            start_new_session=True,
            pass_fds=(ev_w, cmd_r),
        )
        os.close(ev_w)
        os.close(cmd_r)
        self.ctl_r = ev_r
        self.cmd_w = cmd_w
        self.events_fd = ev_w
        for fd in (self.proc.stdout.fileno(), self.proc.stderr.fileno(), self.ctl_r):
            os.set_blocking(fd, False)
        if self.language == "bash":
            # An interrupt stops the running command, not the shell.
            self.send_raw("trap : INT\n")

    def stop(self):
        p = self.proc
        if p and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for f in (self.cmd_w, self.ctl_r):
            try:
                os.close(f)
            except (OSError, TypeError):
                pass
        if p:
            for s in (p.stdout, p.stderr):
                try:
                    s.close()
                except OSError:
                    pass
        self.proc = None

    def restart(self):
        self.stop()
        self.count = 0
        self.start()

    def interrupt(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except OSError:
                pass

    def send_raw(self, text):
        data = text.encode()
        while data:
            n = os.write(self.cmd_w, data)
            data = data[n:]

    def request(self, code, env_vars):
        if self.language == "python":
            self.send_raw(json.dumps({"code": code, "env": env_vars or {}}) + "\n")
        else:
            lines = []
            for k, v in (env_vars or {}).items():
                if k.isidentifier():
                    lines.append("export %s=%s" % (k, shell_quote(str(v))))
            path = "/tmp/.shoal-ci-%s.sh" % self.id
            with open(path, "w") as f:
                f.write(code)
                f.write("\n")
            lines.append("source %s </dev/null" % shell_quote(path))
            lines.append('echo "%s $?" >&%d' % (BASH_DONE, self.events_fd))
            for k in (env_vars or {}):
                if k.isidentifier():
                    lines.append("unset %s" % k)
            self.send_raw("\n".join(lines) + "\n")

    def execute(self, code, env_vars, emit, client_gone):
        """Runs `code`, calling emit(event) as things happen; client_gone()
        says whether to interrupt."""
        self.count += 1
        emit({"type": "number_of_executions", "execution_count": self.count})
        if self.proc is None or self.proc.poll() is not None:
            self.restart()
            self.count = 1
        try:
            self.request(code, env_vars)
        except OSError:
            self.died(emit)
            return
        sel = selectors.DefaultSelector()
        outs = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        for fd in outs:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(self.ctl_r, selectors.EVENT_READ)
        ctl_buf = b""
        done = False
        interrupted_at = last_sigint = None
        decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in outs}
        quiet_since = time.monotonic()
        try:
            while not done:
                if time.monotonic() - quiet_since >= KEEPALIVE:
                    # Lets the host notice a client that went away.
                    emit({"type": "keepalive"})
                    quiet_since = time.monotonic()
                if interrupted_at is None and client_gone():
                    self.interrupt()
                    interrupted_at = last_sigint = time.monotonic()
                elif interrupted_at is not None and time.monotonic() - last_sigint >= INTERRUPT_REPEAT:
                    # Again until the cell ends: a SIGINT that reached the
                    # context before its cell began (ignored there, so
                    # that it cannot hit the next cell) stopped nothing.
                    self.interrupt()
                    last_sigint = time.monotonic()
                if interrupted_at is not None and time.monotonic() - interrupted_at > INTERRUPT_GRACE:
                    emit(error_event("TimeoutError", "execution interrupted and the context restarted", ""))
                    self.restart()
                    return
                for key, _ in sel.select(0.2):
                    quiet_since = time.monotonic()
                    fd = key.fd
                    try:
                        data = os.read(fd, READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if fd in outs:
                        if not data:
                            sel.unregister(fd)
                            continue
                        text = decoders[fd].decode(data)
                        if text:
                            emit({"type": outs[fd], "text": text, "timestamp": now_ns()})
                        continue
                    if not data:
                        # The process ended.
                        self.drain(outs, emit)
                        self.died(emit)
                        return
                    ctl_buf += data
                    while b"\n" in ctl_buf:
                        line, ctl_buf = ctl_buf.split(b"\n", 1)
                        if self.on_control(line.decode("utf-8", "replace"), emit):
                            done = True
            self.drain(outs, emit)
        finally:
            sel.close()

    def on_control(self, line, emit):
        """Handles one line from the context; True at the end of the cell."""
        if self.language == "bash":
            if line.startswith(BASH_DONE):
                code = line[len(BASH_DONE):].strip()
                if code not in ("", "0"):
                    emit(error_event("ExitCodeError", "exit status %s" % code, ""))
                return True
            return False
        try:
            ev = json.loads(line)
        except ValueError:
            return False
        kind = ev.get("type")
        if kind == "done":
            return True
        if kind != "ready":
            emit(ev)
        return False

    def drain(self, outs, emit):
        for fd, name in outs.items():
            while True:
                try:
                    data = os.read(fd, READ_CHUNK)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                emit({"type": name, "text": data.decode("utf-8", "replace"), "timestamp": now_ns()})

    def died(self, emit):
        code = self.proc.poll() if self.proc else None
        emit(error_event("ContextRestarted", "the context's process exited (status %s); it was restarted" % code, ""))
        self.restart()


def shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def error_event(name, value, tb):
    return {"type": "error", "name": name, "value": value, "traceback": tb}


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}

    def create(self, language, cwd):
        ctx = Context(language, cwd)
        with self.lock:
            self.by_id[ctx.id] = ctx
        return ctx

    def default(self, language):
        with self.lock:
            ctx = self.defaults.get(language)
            if ctx is None:
                ctx = Context(language, None)
                self.defaults[language] = ctx
                self.by_id[ctx.id] = ctx
            return ctx

    def get(self, cid):
        with self.lock:
            return self.by_id.get(cid)

    def remove(self, cid):
        with self.lock:
            ctx = self.by_id.pop(cid, None)
            for lang, d in list(self.defaults.items()):
                if d is ctx:
                    del self.defaults[lang]
        if ctx:
            with ctx.lock:
                ctx.stop()
        return ctx is not None

    def all(self):
        with self.lock:
            return list(self.by_id.values())


CONTEXTS = Contexts()
READY = threading.Event()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "shoal-code-interpreter/1"

    def log_message(self, fmt, *args):
        pass

    # ------------------------------------------------------------ helpers

    def body(self):
        te = self.headers.get("Transfer-Encoding", "").lower()
        if "chunked" in te:
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                if not line:
                    raise ValueError("truncated chunked body")
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                if len(out) + size > MAX_BODY:
                    raise ValueError("body too large")
                out += self.rfile.read(size)
                self.rfile.readline(8)
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(n) if n else b""

    def json_body(self):
        raw = self.body()
        if not raw.strip():
            return {}
        v = json.loads(raw)
        if not isinstance(v, dict):
            raise ValueError("expected a JSON object")
        return v

    def reply(self, status, obj=None):
        data = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def fail(self, status, message):
        self.reply(status, {"error": message, "message": message})

    def parts(self):
        return [p for p in self.path.split("?")[0].split("/") if p]

    # ------------------------------------------------------------- routes

    def do_GET(self):
        p = self.parts()
        if p == ["health"]:
            if READY.is_set():
                return self.reply(200, {"status": "ok"})
            return self.fail(503, "starting")
        if p == ["contexts"]:
            return self.reply(200, [c.info() for c in CONTEXTS.all()])
        self.fail(404, "no route %s" % self.path)

    def do_DELETE(self):
        p = self.parts()
        if len(p) == 2 and p[0] == "contexts":
            if CONTEXTS.remove(p[1]):
                return self.reply(204)
            return self.fail(404, "context %s not found" % p[1])
        self.fail(404, "no route %s" % self.path)

    def do_POST(self):
        p = self.parts()
        try:
            req = self.json_body()
        except (ValueError, UnicodeDecodeError) as e:
            return self.fail(400, "bad request body: %s" % e)
        if p == ["execute"]:
            return self.execute(req)
        if p == ["contexts"]:
            lang = LANGS.get((req.get("language") or "python").lower())
            if lang is None:
                return self.fail(400, "unsupported language %r (python and bash are)" % req.get("language"))
            ctx = CONTEXTS.create(lang, req.get("cwd"))
            return self.reply(200, ctx.info())
        if len(p) == 3 and p[0] == "contexts" and p[2] == "restart":
            ctx = CONTEXTS.get(p[1])
            if ctx is None:
                return self.fail(404, "context %s not found" % p[1])
            with ctx.lock:
                ctx.restart()
            return self.reply(204)
        self.fail(404, "no route %s" % self.path)

    def execute(self, req):
        code = req.get("code")
        if not isinstance(code, str):
            return self.fail(400, "'code' must be a string")
        env_vars = req.get("env_vars") or {}
        if not isinstance(env_vars, dict):
            return self.fail(400, "'env_vars' must be an object")
        # The sandbox's create-time variables, under the cell's own (read
        # per cell: the default context predates the sandbox).
        env_vars = dict(sandbox_envs(), **{str(k): str(v) for k, v in env_vars.items()})
        cid = req.get("context_id")
        if cid:
            ctx = CONTEXTS.get(cid)
            if ctx is None:
                return self.fail(404, "context %s not found" % cid)
        else:
            lang = LANGS.get((req.get("language") or "python").lower())
            if lang is None:
                return self.fail(400, "unsupported language %r (python and bash are)" % req.get("language"))
            ctx = CONTEXTS.default(lang)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        state = {"gone": False}
        sock = self.connection

        def emit(ev):
            if state["gone"]:
                return
            line = (json.dumps(ev) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            except OSError:
                state["gone"] = True

        def client_gone():
            if state["gone"]:
                return True
            try:
                sock.setblocking(False)
                try:
                    peek = sock.recv(1, socket.MSG_PEEK)
                finally:
                    sock.setblocking(True)
                if peek == b"":
                    state["gone"] = True
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                state["gone"] = True
            return state["gone"]

        with ctx.lock:
            try:
                ctx.execute(code, env_vars, emit, client_gone)
            except Exception as e:  # the server must answer, whatever broke
                emit(error_event(type(e).__name__, str(e), traceback.format_exc()))
        emit({"type": "end_of_execution"})
        if state["gone"]:
            self.close_connection = True
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


# ----------------------------------------------------------------- worker

RICH = [
    ("html", "_repr_html_"),
    ("markdown", "_repr_markdown_"),
    ("svg", "_repr_svg_"),
    ("png", "_repr_png_"),
    ("jpeg", "_repr_jpeg_"),
    ("pdf", "_repr_pdf_"),
    ("latex", "_repr_latex_"),
    ("json", "_repr_json_"),
    ("javascript", "_repr_javascript_"),
]


def worker_main():
    import warnings

    warnings.filterwarnings("ignore", message=r"(?s).*(non-interactive|non-GUI backend)")
    # A line at a time, as a notebook shows it (the rest at the cell's end).
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    events = os.fdopen(int(os.environ.pop("SHOAL_CI_EVENTS_FD")), "w", buffering=1)
    commands = os.fdopen(int(os.environ.pop("SHOAL_CI_COMMANDS_FD")), "r")
    ns = {"__name__": "__main__", "__builtins__": __builtins__}

    def send(ev):
        events.write(json.dumps(ev) + "\n")
        events.flush()

    def b64(v):
        if isinstance(v, bytes):
            return base64.b64encode(v).decode()
        return v

    def formats(value, main):
        ev = {"type": "result", "is_main_result": main}
        fig = figure_of(value)
        if fig is not None:
            ev["png"] = figure_png(fig)
            ev["text"] = repr(value)
            return ev
        for name, meth in RICH:
            f = getattr(value, meth, None)
            if f is None or not callable(f):
                continue
            try:
                out = f()
            except Exception:
                continue
            if isinstance(out, tuple):
                out = out[0]
            if out is None:
                continue
            if name == "json":
                ev[name] = out
            else:
                ev[name] = b64(out) if name in ("png", "jpeg", "pdf") else str(out)
        try:
            ev["text"] = repr(value)
        except Exception as e:
            ev["text"] = "<repr failed: %s>" % e
        return ev

    def figure_of(value):
        mpl = sys.modules.get("matplotlib.figure")
        if mpl is not None and isinstance(value, mpl.Figure):
            return value
        return None

    def figure_png(fig):
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return base64.b64encode(buf.getvalue()).decode()

    def display(*objs, **_kw):
        sys.stdout.flush()
        for o in objs:
            send(formats(o, False))

    ns["display"] = display

    def flush_figures(skip):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            if fig is not skip:
                send(formats(fig, False))
        plt.close("all")

    cells = [0]

    def run(code, env):
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        main_value = None
        has_main = False
        # Each cell's source is known to linecache, so tracebacks (and
        # inspect) show its lines.
        cells[0] += 1
        name = "<cell %d>" % cells[0]
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            tree = ast.parse(code, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), ns)
            if last is not None:
                main_value = eval(compile(last, name, "eval"), ns)
                has_main = True
        except BaseException as e:  # KeyboardInterrupt and SystemExit too
            sys.stdout.flush()
            sys.stderr.flush()
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            # Drop this worker's own frame.
            tb = [tb[0]] + tb[2:] if len(tb) > 2 else tb
            send(error_event(type(e).__name__, str(e), "".join(tb)))
            flush_figures(None)
            return
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        sys.stdout.flush()
        sys.stderr.flush()
        skip = figure_of(main_value)
        flush_figures(skip)
        if has_main and main_value is not None:
            send(formats(main_value, True))
            ns["_"] = main_value

    warm = os.environ.get("SHOAL_CI_WORKER_WARM", "")
    for mod in filter(None, warm.split(",")):
        try:
            __import__(mod.strip())
        except Exception:
            pass
    send({"type": "ready"})
    # Interrupts count only while a cell runs (one arriving as a cell ends
    # must not leave an error for the next one).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for line in commands:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            try:
                run(req.get("code", ""), req.get("env") or {})
            finally:
                # Ignored again before anything else (the host repeats an
                # interrupt until the cell's end reaches it).
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        except BaseException as e:  # an interrupt outside the cell's code
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            send(error_event(type(e).__name__, str(e), ""))
        sys.stdout.flush()
        sys.stderr.flush()
        send({"type": "done"})


def wait_ready(ctx, timeout):
    """Waits for a new Python context's "ready" line."""
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        sel = selectors.DefaultSelector()
        sel.register(ctx.ctl_r, selectors.EVENT_READ)
        ready = sel.select(0.5)
        sel.close()
        if not ready:
            continue
        try:
            data = os.read(ctx.ctl_r, 4096)
        except BlockingIOError:
            continue
        if not data:
            return False
        buf += data
        if b'"ready"' in buf:
            return True
    return False


class UnixHTTPServer(ThreadingHTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self):
        # No host/port to record (HTTPServer.server_bind expects them).
        socketserver_bind(self)


def socketserver_bind(server):
    import socketserver

    socketserver.TCPServer.server_bind(server)
    server.server_name = "localhost"
    server.server_port = 0


def serve(host, port, unix):
    """Serves on TCP host:port and/or the Unix socket `unix` (what the
    guest agent reaches when the kernel has no IPv4: a sandbox's port N is
    /run/shoal/ports/N)."""
    servers = []
    if unix:
        os.makedirs(os.path.dirname(unix) or ".", exist_ok=True)
        try:
            os.unlink(unix)
        except FileNotFoundError:
            pass
        servers.append(UnixHTTPServer(unix, Handler))
    if port:
        try:
            servers.append(ThreadingHTTPServer((host, port), Handler))
        except OSError as e:
            if not unix:
                raise
            print("no TCP listener (%s): serving %s only" % (e, unix), file=sys.stderr)
    for s in servers:
        s.daemon_threads = True

    def warm_up():
        warm = os.environ.get("SHOAL_CI_WARM", "")
        os.environ["SHOAL_CI_WORKER_WARM"] = warm
        ctx = CONTEXTS.default("python")
        os.environ.pop("SHOAL_CI_WORKER_WARM", None)
        wait_ready(ctx, 600)
        READY.set()

    threading.Thread(target=warm_up, daemon=True).start()
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    servers[0].serve_forever()


def main():
    if "--worker" in sys.argv:
        worker_main()
        return
    port, host, unix = 49999, "0.0.0.0", None
    args = sys.argv[1:]
    for i, a in enumerate(args):
        if a == "--port":
            port = int(args[i + 1])
        if a == "--host":
            host = args[i + 1]
        if a == "--unix":
            unix = args[i + 1]
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Contexts must be interruptible even if this server was started with
    # SIGINT ignored (as a background job): a handled signal is reset to
    # the default in them.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    serve(host, port, unix)


if __name__ == "__main__":
    main()
