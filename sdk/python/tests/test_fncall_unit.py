"""FnCallArgs and FnCallResult against the daemon's wire format
(``api-types/src/fncall.rs``), without a daemon."""

from __future__ import annotations

import pytest

import shoal
from shoal._fncall import fncall_args


def test_args_to_json_sends_only_what_is_set():
    assert shoal.FnCallArgs("python", "print(1)").to_json() == {
        "language": "python",
        "code": "print(1)",
    }
    a = shoal.FnCallArgs(
        language="cpp",
        code="int main(){}",
        stdin=b"1 2\n",
        files={"in.txt": b"\x00\xff", "t.txt": "h\u00e9"},
        fetch_files=["out.txt"],
        timeout_s=2,
        compile_timeout_s=30,
        memory_mib=128,
        env={"A": "1"},
        args=["-v"],
        output_limit=4096,
    )
    assert a.to_json() == {
        "language": "cpp",
        "code": "int main(){}",
        "stdin": "1 2\n",
        "files": {"in.txt": "AP8=", "t.txt": "aMOp"},
        "fetch_files": ["out.txt"],
        "timeout_s": 2.0,
        "compile_timeout_s": 30.0,
        "memory_mib": 128,
        "env": {"A": "1"},
        "args": ["-v"],
        "output_limit": 4096,
    }


def test_bad_args_are_bad_requests():
    with pytest.raises(shoal.BadRequest, match="stdin must be UTF-8"):
        shoal.FnCallArgs("python", "", stdin=b"\xff").to_json()
    with pytest.raises(shoal.BadRequest, match=r"files\['f'\]: expected bytes or str"):
        shoal.FnCallArgs("python", "", files={"f": 3}).to_json()  # type: ignore[dict-item]
    with pytest.raises(shoal.BadRequest, match="not both"):
        fncall_args(shoal.FnCallArgs("python", ""), {"code": "x"})
    with pytest.raises(shoal.BadRequest, match="run_fncall"):
        fncall_args(None, {"language": "python", "cod": "x"})
    assert fncall_args(None, {"language": "bash", "code": "true"}).language == "bash"


def test_result_from_json_decodes_files_and_compile():
    r = shoal.FnCallResult.from_json(
        {
            "status": "compile_error",
            "stdout": "",
            "stderr": "",
            "stdout_truncated": False,
            "stderr_truncated": True,
            "exit_code": None,
            "signal": None,
            "duration_ms": 0.0,
            "total_ms": 812.5,
            "files": {"out.bin": "AP8="},
            "compile": {
                "exit_code": 1,
                "stdout": "",
                "stderr": "main.cpp:1: error",
                "duration_ms": 700.0,
                "timed_out": False,
            },
            "error": None,
        }
    )
    assert r.status == "compile_error" and not r.ok and r.stderr_truncated
    assert r.files == {"out.bin": b"\x00\xff"} and r.total_ms == 812.5
    assert r.compile is not None and r.compile.exit_code == 1
    assert r.compile.stderr == "main.cpp:1: error" and not r.compile.timed_out
    ok = shoal.FnCallResult.from_json({"status": "success", "stdout": "1\n", "exit_code": 0})
    assert ok.ok and ok.stdout == "1\n" and ok.compile is None and ok.files == {}
