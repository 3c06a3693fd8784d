"""gpu_accept.py --deepspeed-from: which earlier DeepSpeed cells a run may take instead of running them."""
import importlib.util
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def _module():
    import sys
    sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location("gpu_accept_reuse", HERE / "gpu_accept.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_only_ok_deepspeed_cells_of_this_card_are_taken_and_later_files_win(tmp_path):
    accept = _module()
    card, other = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(first, [
        {"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "zero1", "status": "ok", "device": card, "losses": [1.0]},
        {"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "zero2", "status": "ok", "device": other},
        {"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "zero3", "status": "ok", "device": card, "losses": [1.0]},
        {"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "trainer_zero3", "status": "not run", "device": card},
        {"event": "cell", "engine": "ours", "model": "llama", "variant": "zero1", "status": "ok", "device": card},
        {"event": "begin", "engine": "deepspeed", "model": "llama", "variant": "zero0"},
    ])
    _write(second, [
        {"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "zero3", "status": "ok", "device": card, "losses": [2.0]},
        {"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "trainer_zero3", "status": "ok", "device": card},
    ])
    taken = accept.deepspeed_cells([str(first), str(second)], card)
    assert set(taken) == {("llama", "zero1"), ("llama", "zero3"), ("llama", "trainer_zero3")}
    assert taken[("llama", "zero3")]["losses"] == [2.0] and taken[("llama", "zero3")]["reused_from"] == str(second)
    assert accept.deepspeed_cells([str(first)], None) == {}   # this run's card unknown: nothing is taken


def test_a_trainer_cell_without_a_card_takes_the_one_card_of_the_files_it_came_with(tmp_path):
    # the morning's trainer rerun (2026-12-07) recorded its cells without the card
    accept = _module()
    card = "NVIDIA H100 80GB HBM3"
    cells, rerun = tmp_path / "cells.jsonl", tmp_path / "rerun.jsonl"
    _write(cells, [{"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "zero1", "status": "ok", "device": card}])
    _write(rerun, [{"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "trainer_zero3", "status": "ok"}])
    assert set(accept.deepspeed_cells([str(cells), str(rerun)], card)) == {("llama", "zero1"), ("llama", "trainer_zero3")}
    assert set(accept.deepspeed_cells([str(cells), str(rerun)], "NVIDIA H200")) == set()
    _write(cells, [{"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "zero1", "status": "ok", "device": card},
                   {"event": "cell", "engine": "deepspeed", "model": "llama", "variant": "zero2", "status": "ok", "device": "NVIDIA H200"}])
    assert set(accept.deepspeed_cells([str(cells), str(rerun)], card)) == {("llama", "zero1")}   # two cards: which one is unknown
