"""SandboxFusion's stock client (``sandbox-fusion`` 0.3.7 from PyPI,
unmodified) against shoald's ``/run_code`` on TCP: the token goes in the
endpoint URL (sent as HTTP Basic auth). Real daemon, real guests."""

from __future__ import annotations

import base64

import httpx
import pytest
from sandbox_fusion import RunCodeRequest, RunStatus, run_code, run_code_async
from sandbox_fusion.models import CommandRunStatus


@pytest.fixture
def endpoint(fncall_daemon) -> str:
    return f"http://fusion:{fncall_daemon.token}@127.0.0.1:{fncall_daemon.port}"


def test_python_success_failure_and_timeout(endpoint):
    r = run_code(RunCodeRequest(code="print('hi')", language="python"), endpoint=endpoint)
    assert r.status == RunStatus.Success and r.message == ""
    assert r.compile_result is None
    assert r.run_result.status == CommandRunStatus.Finished
    assert (r.run_result.return_code, r.run_result.stdout) == (0, "hi\n")
    assert r.run_result.execution_time is not None and r.run_result.execution_time > 0

    code = "import sys\nprint(input()[::-1])\nsys.exit(3)"
    r = run_code(
        RunCodeRequest(code=code, language="python", stdin="abc\n", run_timeout=60),
        endpoint=endpoint,
    )
    assert r.status == RunStatus.Failed
    assert (r.run_result.return_code, r.run_result.stdout) == (3, "cba\n")

    r = run_code(
        RunCodeRequest(code="while True: pass", language="python", run_timeout=1),
        endpoint=endpoint,
    )
    assert r.status == RunStatus.Failed
    assert r.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert r.run_result.return_code is None


def test_files_in_and_out(endpoint):
    code = "open('out.txt', 'w').write(open('data/in.txt').read() * 2)"
    r = run_code(
        RunCodeRequest(
            code=code,
            language="python",
            files={"data/in.txt": base64.b64encode(b"ab").decode()},
            fetch_files=["out.txt"],
            run_timeout=60,
        ),
        endpoint=endpoint,
    )
    assert r.status == RunStatus.Success, r
    assert base64.b64decode(r.files["out.txt"]) == b"abab"


async def test_the_async_client(endpoint):
    r = await run_code_async(
        RunCodeRequest(code="print(2**10)", language="python", run_timeout=60), endpoint=endpoint
    )
    assert r.status == RunStatus.Success and r.run_result.stdout == "1024\n"


def test_cpp_compile_and_run(endpoint):
    ok = '#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<"\\n";return 0;}'
    r = run_code(RunCodeRequest(code=ok, language="cpp", stdin="2 40", compile_timeout=280, run_timeout=60), endpoint=endpoint)
    assert r.status == RunStatus.Success, r
    assert r.compile_result.status == CommandRunStatus.Finished
    assert r.compile_result.return_code == 0
    assert r.run_result.stdout == "42\n"
    r = run_code(RunCodeRequest(code="int main( {", language="cpp", compile_timeout=280), endpoint=endpoint)
    assert r.status == RunStatus.Failed
    assert r.compile_result.return_code not in (None, 0) and r.run_result is None
    assert "error" in r.compile_result.stderr


def test_malformed_requests_are_400s(fncall_daemon, endpoint):
    url = f"http://127.0.0.1:{fncall_daemon.port}/run_code"
    auth = ("fusion", fncall_daemon.token)
    for body, want in [
        ({"code": "x", "language": "cobol"}, "unknown language 'cobol'"),
        ({"code": "x", "language": "python", "run_timeout": -1}, "run_timeout must be"),
        ({"code": "x", "language": "python", "files": {"f": "!!"}}, "is not base64"),
        ({"language": "python"}, "missing field `code`"),
        ({"code": "x" * ((1 << 20) + 1), "language": "python"}, "code is"),
    ]:
        r = httpx.post(url, json=body, auth=auth)
        assert r.status_code == 400, (body, r.text)
        assert want in r.json()["error"]["message"], r.text
    # The stock client raises (after its retries: one here) with the reason.
    with pytest.raises(Exception, match="responded with code 400.*unknown language"):
        run_code(RunCodeRequest(code="x", language="java"), endpoint=endpoint, max_attempts=1)


def test_tcp_needs_the_token(fncall_daemon):
    url = f"http://127.0.0.1:{fncall_daemon.port}"
    assert httpx.get(f"{url}/v1/ping").status_code == 401
    r = httpx.get(f"{url}/v1/ping", auth=("fusion", fncall_daemon.token))
    assert (r.status_code, r.json()) == (200, "pong")
    r = httpx.post(f"{url}/run_code", json={"code": "print(1)", "language": "python"})
    assert r.status_code == 401
