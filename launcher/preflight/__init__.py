"""Preflight: check every host in parallel before a launch, and say how to fix what fails.

    report = run_preflight(hosts, PreflightRequest(launcher="pdsh", script="train.py"))
    print(report.format_table()); sys.exit(0 if report.ok else 3)

Torch-free; paramiko is imported only when a connection is made.
"""
from launcher.preflight.report import Check, HostReport, PreflightReport
from launcher.preflight.request import PreflightRequest
from launcher.preflight.run import run_preflight

__all__ = ["Check", "HostReport", "PreflightReport", "PreflightRequest", "run_preflight"]
