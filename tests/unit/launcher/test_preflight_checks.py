"""Pure findings from probe results: version comparison across hosts, GPUs versus slots."""
import pytest

from launcher.preflight import checks as C
from launcher.preflight.request import PreflightRequest


@pytest.mark.parametrize("values, reference, expect", [
    ({"a": "2.4", "b": "2.4"}, None, {"a": None, "b": None}),
    ({"a": "2.4", "b": "2.4", "c": "2.1"}, None, {"a": None, "b": None, "c": "2.1"}),
    ({"a": "2.1", "b": "2.4"}, None, {"a": None, "b": "2.4"}),           # tie: first host wins
    ({"a": "0.1", "b": "0.2"}, "0.1", {"a": None, "b": "0.2"}),           # explicit reference
    ({"a": "0.2", "b": "0.2"}, "0.1", {"a": "0.2", "b": "0.2"}),
    ({"a": None, "b": "2.4"}, None, {"a": None, "b": None}),              # missing: not a mismatch
])
def test_compare_versions(values, reference, expect):
    problems = C.compare_versions(values, reference, "torch")
    assert {h: (p.split()[1] if p else None) for h, p in problems.items()} == expect


def test_version_problem_says_who_has_what():
    problems = C.compare_versions({"n1": "2.4.0", "n2": "2.4.0", "n3": "2.1.0"}, what="torch")
    assert problems["n3"] == "torch 2.1.0 here differs from 2.4.0 (2.4.0 on n1, n2; 2.1.0 on n3)"


def test_python_compares_minor_versions():
    assert C.minor("3.11.7") == "3.11" and C.minor(None) is None


@pytest.mark.parametrize("result, slots, require, ok, warning, words", [
    ({"torch": {"version": "2.4"}, "nvidia_smi_gpus": None}, 2, False, True, True, "no CUDA GPU"),
    ({"torch": {"version": "2.4"}, "nvidia_smi_gpus": None}, 2, True, False, False, "no CUDA GPU"),
    ({"torch": {"cuda_available": True, "device_count": 8}}, 8, False, True, False, "8 GPU(s) for 8"),
    ({"torch": {"cuda_available": True, "device_count": 4}}, 8, False, False, False, "slots=8"),
    ({"torch": {"cuda_available": False, "version": "2.4+cpu"}, "nvidia_smi_gpus": 8}, 8, False,
     False, False, "nvidia-smi lists 8"),
    ({"torch": {"version": "2.4"}, "nvidia_smi_gpus": 2}, 2, False, True, False, "2 GPU(s)"),
])
def test_gpu_check(result, slots, require, ok, warning, words):
    check = C.gpu_check(result, slots, require)
    assert (check.ok, check.warning) == (ok, warning)
    assert words in check.detail
    assert check.ok or check.hint


def test_probe_failure_tells_missing_python_from_other_failures():
    missing = C.probe_failed("/nope/python", 127, "sh: 1: /nope/python: not found\n", "n1")
    assert missing.name == "python" and "not found" in missing.detail and "--remote_python" in missing.hint
    crashed = C.probe_failed("python2", 1, "Traceback...\nSyntaxError: invalid syntax", "n1")
    assert "exit 1: SyntaxError: invalid syntax" in crashed.detail
    silent = C.probe_failed("python3", None, "", "n1")
    assert "gave no answer" in silent.detail


GOOD = {"python": {"executable": "/usr/bin/python3", "version": "3.11.7"},
        "torch": {"version": "2.13.0+cpu", "cuda_build": None},
        "dslaunch": {"version": "0.1.0", "path": "/x/launcher"},
        "workdir": {"path": "/w", "exists": True},
        "script": {"path": "train.py", "exists": True}}
NO_PROBLEMS = {"python": None, "torch": None, "dslaunch": None}


def _names(checks):
    return {c.name: c for c in checks}


def test_host_checks_of_a_good_host():
    checks = _names(C.host_checks("n1", 2, GOOD, PreflightRequest(), NO_PROBLEMS))
    assert list(checks) == ["python", "torch", "dslaunch", "gpus", "workdir", "script"]
    assert all(c.ok for c in checks.values())
    assert checks["torch"].detail == "2.13.0+cpu (CPU build)"


def test_fast_path_skips_gpus_and_script():
    checks = _names(C.host_checks("n1", 2, GOOD, PreflightRequest(fast=True), NO_PROBLEMS))
    assert list(checks) == ["python", "torch", "dslaunch", "workdir"]


def test_host_checks_of_a_bad_host():
    bad = dict(GOOD, torch={"version": None, "error": "no module named 'torch'"},
               dslaunch={"version": None, "error": "ModuleNotFoundError: No module named 'launcher'"},
               workdir={"path": "/w", "exists": False}, script={"path": "t.py", "exists": False})
    checks = _names(C.host_checks("n1", 2, bad, PreflightRequest(), dict(NO_PROBLEMS, python="python 3.9 here")))
    assert [n for n, c in checks.items() if not c.ok] == ["python", "torch", "dslaunch", "workdir", "script"]
    assert "no module named 'torch'" in checks["torch"].detail
    assert "--workdir" in checks["workdir"].hint
    assert "python 3.9 here" in checks["python"].detail


def test_rendezvous_and_master_port():
    ok = C.rendezvous_check({"route": {"interface": "eth0", "source": "10.0.0.2"},
                             "connect": {"ok": True}}, "10.0.0.1", 29500, True)
    assert ok.ok and ok.detail == "reached 10.0.0.1:29500 via eth0 (10.0.0.2)"
    refused = C.rendezvous_check({"route": {}, "connect": {"ok": False, "error": "refused"}},
                                 "10.0.0.1", 29500, None)
    assert not refused.ok and "firewall" in refused.hint
    elsewhere = C.rendezvous_check({"route": {}, "connect": {"ok": True}}, "10.0.0.1", 29500, False)
    assert not elsewhere.ok and "another machine" in elsewhere.detail
    taken = C.master_port_check({"ok": False, "error": "[Errno 98] Address already in use",
                                 "owner": "pid 7 (nc -l)"}, "n1", 29500)
    assert not taken.ok and "taken on n1 by pid 7 (nc -l)" in taken.detail
    assert "--master_port" in taken.hint
    assert C.master_port_check({"ok": True}, "n1", 29500).ok


def test_python_older_than_3_10_fails():
    old = dict(GOOD, python={"executable": "/usr/bin/python3.8", "version": "3.8.10"})
    python = _names(C.host_checks("n1", 2, old, PreflightRequest(), NO_PROBLEMS))["python"]
    assert not python.ok and "needs Python 3.10 or newer" in python.detail
