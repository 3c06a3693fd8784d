"""The memory estimator against DeepSpeed's formulas, written out by hand here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import UsageError
from launcher.zero.engine import estimate as est

GIB = 2 ** 30
REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run(args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=ENV, **kw)


def ds_zero2(total, gpn, nodes, offload, f=1.5):
    """DeepSpeed's estimate_zero2_model_states_mem_needs, restated: (cpu, gpu)."""
    n = gpn * nodes
    if offload:
        return int(total * max(4 * n, 16) * f), int(2 * total)
    return int(total * 4 * gpn * f), int(2 * total + int(18 * total / n))


def ds_zero3(total, largest, gpn, nodes, offload, offload_param, zero_init, f=1.5):
    """DeepSpeed's estimate_zero3_model_states_mem_needs, restated: (cpu, gpu)."""
    n = gpn * nodes
    ll = 4 * largest
    if offload and offload_param:
        gpu = ll
        cpu = total * (18 / nodes if zero_init else max(4 * gpn, 18 / nodes)) * f
    elif offload:
        gpu = ll + int(2 * total / n)
        cpu = total * (16 / nodes if zero_init else max(4 * gpn, 16 / nodes)) * f
    else:
        gpu = ll + int(18 * total / n)
        cpu = (largest if zero_init else total) * 4 * gpn * f
    return int(cpu), int(gpu)


SHAPES = [(60_506_624, 16_449_536, 1, 1), (1_500_000_000, 80_000_000, 8, 2),
          (7_000_000_000, 131_000_000, 4, 1), (1_000, 10, 3, 1), (13e9, 325e6, 8, 1)]


@pytest.mark.parametrize("total,largest,gpn,nodes", SHAPES)
def test_stage2_and_3_rows_equal_deepspeed_formulas(total, largest, gpn, nodes):
    r = est.estimate_memory(int(total), gpn, nodes, largest_layer_params=int(largest))
    for offload in (False, True):
        cpu, gpu = ds_zero2(int(total), gpn, nodes, offload)
        row = r.row(2, offload)
        assert (row.cpu_bytes_per_node, row.gpu_bytes_per_device) == (cpu, gpu)
    for offload, offload_param in ((False, False), (True, False), (True, True)):
        for zero_init in (True, False):
            cpu, gpu = ds_zero3(int(total), int(largest), gpn, nodes, offload, offload_param, zero_init)
            row = r.row(3, offload, offload_param, zero_init)
            assert (row.cpu_bytes_per_node, row.gpu_bytes_per_device) == (cpu, gpu), row


def test_t5_small_matches_deepspeeds_printed_table():
    # DeepSpeed prints 1.52GB | 0.06GB and 0.09GB | 1.08GB for t5-small on one GPU.
    r = est.estimate_memory(60_506_624, 1, 1, largest_layer_params=16_449_536)
    both = r.row(3, True, True, True)
    assert round(both.cpu_bytes_per_node / GIB, 2) == 1.52 and round(both.gpu_bytes_per_device / GIB, 2) == 0.06
    none = r.row(3, False, False, True)
    assert round(none.cpu_bytes_per_node / GIB, 2) == 0.09 and round(none.gpu_bytes_per_device / GIB, 2) == 1.08
    optim = r.row(3, True, False, True)
    assert round(optim.cpu_bytes_per_node / GIB, 2) == 1.35 and round(optim.gpu_bytes_per_device / GIB, 2) == 0.17


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_stages_0_and_1_use_the_same_byte_accounting(n):
    total = 7_500_000_000
    r = est.estimate_memory(total, n, 1)
    assert r.row(0).gpu_bytes_per_device == 20 * total
    assert r.row(1).gpu_bytes_per_device == 4 * total + int(16 * total / n)
    assert r.row(1, True).gpu_bytes_per_device == 4 * total
    # more partitioning never needs more GPU memory
    gpu = [r.row(s).gpu_bytes_per_device for s in (0, 1, 2, 3)]
    assert gpu == sorted(gpu, reverse=True)


def test_every_stage_and_offload_choice_has_one_row():
    r = est.estimate_memory(1e9, 2, 1)
    keys = {(x.stage, x.offload_optimizer, x.offload_param, x.zero_init) for x in r.rows}
    assert len(keys) == len(r.rows) == 11
    assert {x.stage for x in r.rows} == {0, 1, 2, 3}
    assert not any(x.offload_param for x in r.rows if x.stage != 3)
    with pytest.raises(Exception):
        r.row(2, True, True)


def test_a_model_is_counted_with_shared_params_once():
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        emb = torch.nn.Embedding(100, 8)
        head = torch.nn.Linear(8, 100, bias=False)
        head.weight = emb.weight
        model = torch.nn.Sequential(emb, torch.nn.Linear(8, 8), head)
    total, largest = est.count_params(model)
    assert total == 800 + 72 and largest == 800
    r = est.estimate_memory(model, 2, 1)
    assert r.total_params == 872 and not r.largest_layer_assumed


def test_largest_layer_guess_is_flagged():
    r = est.estimate_memory(1.5e9)
    assert r.largest_layer_assumed and 0 < r.largest_layer_params < 1.5e9
    assert "assumed" in est.format_table(r)


@pytest.mark.parametrize("args", [(0,), (100, 0), (100, 1, 0), (10, 1, 1, 11)])
def test_bad_shapes_are_usage_errors(args):
    with pytest.raises(UsageError):
        est.estimate_memory(*args)


def test_out_of_memory_hint_names_a_config_that_fits():
    r = est.estimate_memory(1e9, 8, 1, largest_layer_params=5e7)
    hint = est.out_of_memory_hint(r, stage=0, offload_optimizer=False, offload_param=False, gpu_bytes=5 * GIB)
    assert "stage=0" in hint and "set stage=2, offload_optimizer=none" in hint
    none_fit = est.out_of_memory_hint(r, 0, False, False, gpu_bytes=1)
    assert "no stage" in none_fit


def test_gpt_shape():
    total, largest = est.gpt_params(48, 1600, 50257)
    assert 1.55e9 < total < 1.56e9 and largest == 50257 * 1600


def test_cli_prints_table_and_json_without_importing_torch():
    code = ("import sys; from launcher.zero.engine import estimate as e; rc = e.main(['--params', '1.5e9', "
            "'--num_gpus', '8', '--num_nodes', '2', '--json']); "
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH'); sys.exit(rc)")
    out = run(["-c", code], check=True).stdout
    doc = json.loads(out[:out.rindex("}") + 1])
    assert doc["num_nodes"] == 2 and len(doc["rows"]) == 13   # dslaunch's figures: + 2 offload_param=nvme rows
    table = run(["-m", "launcher.zero.engine.estimate", "--gpt", "48,1600,50257", "--num_gpus", "8"], check=True).stdout
    assert "stage=3, offload_optimizer=cpu, offload_param=cpu, zero_init=1" in table
    # launcher/zero/__init__ belongs to the engine; the estimator itself must not pull torch in.
    assert "NOTORCH" in out, "importing launcher.zero.engine.estimate imported torch"


def test_cli_bad_input_exits_2():
    p = run(["-m", "launcher.zero.engine.estimate", "--gpt", "48,1600"])
    assert p.returncode == 2 and "LAYERS,HIDDEN,VOCAB" in p.stderr


def test_out_of_memory_note_uses_the_runs_config():
    torch = pytest.importorskip("torch")
    from launcher.zero.config.load import load_config
    cfg = load_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}}, world_size=2)
    with torch.device("meta"):
        model = torch.nn.Linear(1000, 1000)
    note = est.out_of_memory_note(model, cfg, world_size=2, local_world_size=2, device="cpu")
    assert "offload_param=cpu" in note and "GiB per device" in note


def test_against_the_installed_deepspeed_when_there_is_one():
    """When DeepSpeed itself is installed, its estimator functions give the same bytes."""
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as ds3
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as ds2
    except Exception:  # noqa: BLE001 - not installed, or its import fails on this machine
        pytest.skip("deepspeed is not importable here")
    for total, largest, gpn, nodes in SHAPES:
        total, largest = int(total), int(largest)
        r = est.estimate_memory(total, gpn, nodes, largest_layer_params=largest)
        for offload in (False, True):
            row = r.row(2, offload)
            assert (row.cpu_bytes_per_node, row.gpu_bytes_per_device) == ds2(total, gpn, nodes, offload)
        for offload, offload_param in ((False, False), (True, False), (True, True)):
            for zero_init in (True, False):
                cpu, gpu, _ = ds3(total, largest, gpn, nodes, offload, offload_param, zero_init)
                row = r.row(3, offload, offload_param, zero_init)
                assert (row.cpu_bytes_per_node, row.gpu_bytes_per_device) == (cpu, gpu)


@pytest.mark.parametrize("text, count", [("1.5B", 1.5e9), ("350M", 350e6), ("125k", 125e3), ("7b", 7e9),
                                         ("1.5e9", 1.5e9), ("1_000", 1000.0)])
def test_params_are_read_as_people_write_them(text, count):
    from launcher.zero.engine.estimate import parse_count
    assert parse_count(text) == count


def test_cli_takes_1_5B_and_rejects_words_with_a_hint():
    same = [run(["-m", "launcher.zero.engine.estimate", "--params", p, "--json"], check=True).stdout for p in ("1.5B", "1.5e9")]
    assert same[0] == same[1]
    bad = run(["-m", "launcher.zero.engine.estimate", "--params", "lots"])
    assert bad.returncode == 2 and "write 1.5B, 350M, 125k or 1.5e9" in bad.stderr


def test_dslaunch_stage3_optimizer_offload_needs_12_host_bytes_a_parameter():
    """Our stage 3 offload feeds the CPU Adam from the device's gradients (grad_feed): the host keeps
    the fp32 master and two moments (12 B/param, DeepSpeed's estimate says 16) and the device keeps
    the 16-bit gradient shard; everything else is DeepSpeed's figure."""
    total, largest, gpn = 10**9, 5 * 10**7, 4
    ours = est.estimate_memory(total, gpn, 1, largest_layer_params=largest, engine="dslaunch")
    theirs = est.estimate_memory(total, gpn, 1, largest_layer_params=largest)
    for offload_param, host_bytes in ((False, 12), (True, 14)):
        mine, ds = ours.row(3, True, offload_param, True), theirs.row(3, True, offload_param, True)
        assert mine.cpu_bytes_per_node == int(total * host_bytes * 1.5)
        assert ds.cpu_bytes_per_node == int(total * (host_bytes + 4) * 1.5)
        assert mine.gpu_bytes_per_device == ds.gpu_bytes_per_device + 2 * total // gpn
    mine_rows = {(r.stage, r.offload_optimizer, r.offload_param, r.zero_init): r for r in ours.rows}
    for r in theirs.rows:
        if not (r.stage == 3 and r.offload_optimizer):
            assert mine_rows[(r.stage, r.offload_optimizer, r.offload_param, r.zero_init)] == r
    table = run(["-m", "launcher.zero.engine.estimate", "--params", "1e9", "--json"], check=True).stdout
    doc = json.loads(table)
    assert doc["engine"] == "dslaunch"
    row = next(r for r in doc["rows"] if r["stage"] == 3 and r["offload_optimizer"] and not r["offload_param"]
               and r["zero_init"])
    assert row["cpu_bytes_per_node"] == int(1e9 * 12 * 1.5)
