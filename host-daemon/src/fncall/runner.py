# Shoal FnCall warm python runner.
#
# Started once in the python template (by the daemon, as a detached exec of
# the guest agent), it imports the standard modules (and numpy when it is
# installed), prints the ready marker and blocks reading its call on stdin;
# the daemon snapshots the guest right then. Every call is served by a fresh
# copy-on-write clone of that snapshot, so this process runs exactly one
# call and then exits: nothing of one call can reach the next.
#
# The call, on stdin: 10 ASCII decimal digits N, then N bytes of JSON
# {"code", "args", "env", "memory_max", "nonce"}; everything after it on
# stdin is the program's stdin. The program's stdout and stderr are this
# process's. Exit status: the program's (SystemExit code; 1 after an
# uncaught exception, whose traceback goes to stderr as python3 prints it);
# 125: a broken request. Once the program is done, each stream ends with
# "\0SHOAL-FNCALL-END:NONCE" (stdout's with ":STATUS", and ":oom" when the
# program failed with a MemoryError at its memory limit), then a newline.
import os
import sys


def _read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        b = os.read(0, n - len(buf))
        if not b:
            os._exit(125)
        buf += b
    return bytes(buf)


# What most calls import, imported before the snapshot.
import abc, array, atexit, base64, bisect, builtins, collections, contextlib  # noqa: E401,E402
import copy, dataclasses, datetime, decimal, enum, fractions, functools  # noqa: E401,E402
import hashlib, heapq, io, itertools, json, math, operator, random, re  # noqa: E401,E402
import resource  # noqa: E402
import statistics, string, struct, textwrap, time, traceback, types  # noqa: E401,E402
import typing, unittest  # noqa: E401,E402

try:
    import numpy  # noqa: F401
except ImportError:
    numpy = None

WORKDIR = "/tmp/fncall"
os.makedirs(WORKDIR, exist_ok=True)
os.chdir(WORKDIR)

# This process's cgroup (its own, made by the agent for this exec): its
# memory.max is the call's memory limit, written when the call comes. The
# agent's exec cgroups have no memory controller of their own: it is
# enabled below the user cgroup first.
_memfd = None
_memerr = "no cgroup"
try:
    with open("/proc/self/cgroup") as f:
        _cg = "/sys/fs/cgroup" + f.read().strip().split("::", 1)[-1]
    try:
        with open(os.path.dirname(_cg) + "/cgroup.subtree_control", "w") as f:
            f.write("+memory")
    except OSError:
        pass
    _memfd = os.open(_cg + "/memory.max", os.O_WRONLY)
except OSError as e:
    _memerr = str(e)

sys.stdout.buffer.write(b"\0SHOAL-FNCALL-READY\n")
sys.stdout.flush()

# ---- snapshot taken here; what follows runs in a clone ----

try:
    _n = int(_read_exact(10))
    _req = json.loads(_read_exact(_n))
    _code = _req["code"]
except Exception as e:  # noqa: BLE001
    os.write(2, ("shoal fncall runner: bad request: %r\n" % (e,)).encode())
    os._exit(125)

if _req.get("memory_max"):
    if _memfd is None:
        os.write(2, ("shoal fncall runner: no memory limit: %s\n" % _memerr).encode())
        os._exit(125)
    try:
        os.write(_memfd, str(int(_req["memory_max"])).encode())
    except OSError as e:
        os.write(2, ("shoal fncall runner: memory limit: %s\n" % e).encode())
        os._exit(125)

# The same limit on this process's data segment, above what it holds now:
# an allocation past it fails at once (MemoryError) rather than after the
# cgroup's reclaim, which emulated guest kernels make very slow.
if _req.get("memory_max"):
    try:
        with open("/proc/self/status") as f:
            _data = [int(l.split()[1]) << 10 for l in f if l.startswith("VmData:")]
        _lim = (_data[0] if _data else 0) + int(_req["memory_max"])
        resource.setrlimit(resource.RLIMIT_DATA, (_lim, _lim))
    except (OSError, ValueError) as e:
        os.write(2, ("shoal fncall runner: data limit: %s\n" % e).encode())
        os._exit(125)

# Clones share the snapshot's random state: reseed from the kernel (which
# got fresh entropy at the restore).
random.seed()
if numpy is not None:
    numpy.random.seed()

os.environ.update(_req.get("env") or {})
_path = os.path.join(WORKDIR, "main.py")
with open(_path, "w") as f:
    f.write(_code)
sys.argv = [_path] + list(_req.get("args") or [])
sys.path[0] = WORKDIR

_main = types.ModuleType("__main__")
_main.__file__ = _path
_main.__builtins__ = builtins
sys.modules["__main__"] = _main


def _exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(str(c) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


_status = 0
_oom = False
try:
    exec(compile(_code, _path, "exec"), _main.__dict__)
except SystemExit as e:
    _status = _exit_code(e)
except MemoryError as e:
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    _status, _oom = 1, True
except BaseException as e:  # noqa: BLE001
    # As python3 prints it: without this runner's frame.
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    _status = 1

try:
    atexit._run_exitfuncs()
except SystemExit as e:
    _status = _exit_code(e)
except BaseException:  # noqa: BLE001
    pass
for _s in (sys.stdout, sys.stderr):
    try:
        _s.flush()
    except Exception:  # noqa: BLE001
        pass
# The end of each stream, with the status: the daemon answers on these,
# without waiting for this process's exit (slow on emulated guest kernels,
# and the clone is destroyed anyway).
_end = b"\0SHOAL-FNCALL-END:" + str(_req.get("nonce", "")).encode()
try:
    os.write(2, _end + b"\n")
    os.write(1, _end + b":" + str(_status).encode() + (b":oom" if _oom else b"") + b"\n")
except OSError:
    pass
os._exit(_status)
