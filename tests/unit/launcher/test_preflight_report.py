"""The preflight report as data: the --check --json document and the human table."""
import json

from launcher.preflight.report import Check, HostReport, PreflightReport


def _report():
    return PreflightReport((
        HostReport("worker-0", (Check("ssh", True, "root@10.0.0.1:22"),
                                Check("gpus", True, "no CUDA GPU", None, warning=True))),
        HostReport("worker-1", (Check("ssh", False, "authentication failed (publickey)",
                                      "ssh-copy-id worker-1"),)),
    ))


def test_json_is_the_contract_document():
    doc = json.loads(_report().to_json())
    assert doc == {"ok": False, "hosts": [
        {"host": "worker-0", "ok": True, "checks": [
            {"name": "ssh", "ok": True, "detail": "root@10.0.0.1:22", "hint": None},
            {"name": "gpus", "ok": True, "detail": "warning: no CUDA GPU", "hint": None}]},
        {"host": "worker-1", "ok": False, "checks": [
            {"name": "ssh", "ok": False, "detail": "authentication failed (publickey)",
             "hint": "ssh-copy-id worker-1"}]}]}


def test_ok_needs_every_check_of_every_host_and_at_least_one_host():
    assert not _report().ok
    assert PreflightReport((HostReport("a", (Check("ssh", True),)),)).ok
    assert not PreflightReport(()).ok
    assert [h.host for h in _report().failed_hosts] == ["worker-1"]


def test_table_has_a_row_per_host_and_check_and_repeats_failures_with_hints():
    table = _report().format_table().splitlines()
    assert table[0].split() == ["HOST", "CHECK", "RESULT", "DETAIL"]
    rows = [line.split()[:3] for line in table[1:4]]
    assert rows == [["worker-0", "ssh", "ok"], ["worker-0", "gpus", "warn"],
                    ["worker-1", "ssh", "FAIL"]]
    text = "\n".join(table)
    assert "preflight failed on 1 of 2 host(s): worker-1" in text
    assert "  worker-1 ssh: authentication failed (publickey)\n    hint: ssh-copy-id worker-1" in text


def test_table_of_a_healthy_report_says_so():
    report = PreflightReport((HostReport("a", (Check("ssh", True, "x"),)),), elapsed_s=1.25)
    assert report.format_table().splitlines()[-1] == "preflight ok: 1 host(s) passed every check in 1.2 s"


def test_lookup_helpers():
    report = _report()
    assert report.host("worker-1").check("ssh").hint == "ssh-copy-id worker-1"
    assert report.host("worker-0").check("torch") is None
    assert report.host("nope") is None


def test_a_failed_launch_preflight_hints_no_preflight_only_where_it_would_help(capsys):
    import pytest

    from launcher.control.check import preflight_failed
    from launcher.errors import PreflightError

    cases = [  # (the failed check, whether --no-preflight is offered)
        (Check("ssh", False, "cannot resolve 'nohost'", "check the name"), False),
        (Check("python", False, "remote python '/x/py' not found", "--remote_python"), False),
        (Check("master_port", False, "port 29500 is taken on node1", "--master_port 0"), True),
    ]
    for check, offered in cases:
        with pytest.raises(PreflightError) as info:
            preflight_failed(PreflightReport((HostReport("node1", (check,)),)))
        assert info.value.message == "nothing was started on any node"
        assert ("skip the checks with --no-preflight" in info.value.hint) == offered, check.name
        assert ("--no-preflight would not help" in info.value.hint) == (not offered), check.name
    assert capsys.readouterr().err.count("preflight failed on 1 of 1 host(s): node1") == len(cases)  # the table, once each
