"""A NaN named where it was born, during its step (issue 42 items 2 and 3), through the real launcher
on 2 ranks: a tutorial-style script plants an inf keyed on ``engine.global_steps``, so a re-run of
the micro-batch after the step would stay finite; the job says one message, from rank 0."""
import json
import os

from tests.helpers.world import REPO, run_world

WORKER = os.path.join(REPO, "tests", "dist", "workers", "nan_step_worker.py")


def run(tmp_path, config: dict, layer: str, global_steps: int, rank: int, micro_batch: int, phase: str):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "gradient_clipping": 1.0,
                                "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                "non_finite": {"trace": True}, **config}))
    results = run_world(WORKER, 2, str(path), layer, str(global_steps), "5", str(rank), str(micro_batch), phase,
                        timeout=300)
    assert all(r.returncode == 0 for r in results), results[0].stderr + results[1].stderr
    assert [r.records()[0]["skipped"] for r in results] == [1, 1]
    return results


QUIET = ("[zero] progress", "RESULT", "[zero] ready", "[zero] bf16 on CPU", "dslaunch: no GPU found")


def said_by(result) -> str:
    """What one rank printed besides progress lines, its result and the start-up lines."""
    return "".join(line + "\n" for line in (result.stdout + result.stderr).splitlines() if not line.startswith(QUIET))


def said_about_the_step(results) -> str:
    """What rank 0 said; no other rank said anything."""
    assert [said_by(r) for r in results[1:]] == [""], [said_by(r) for r in results]
    return said_by(results[0])


def test_a_step_keyed_inf_is_named_with_its_module_rank_and_micro_batch_in_one_message_from_rank_0(tmp_path):
    results = run(tmp_path, {"zero_optimization": {"stage": 1}}, "blocks.1.fc", 3, rank=1, micro_batch=-1,
                  phase="forward")
    said = said_about_the_step(results)
    lines = said.splitlines()
    assert lines[0] == "[zero] rank 0: warning: non-finite gradients at step 4: the loss itself was non-finite " \
                       "(nan on rank 1)", said
    assert lines[1] == "first non-finite output in forward order: blocks.1.fc (Linear) on rank 1, " \
                       "micro-batch 1 of 1 of the step", said
    assert lines[2].startswith("last finite loss: ") and lines[2].endswith(" at step 3 (mean over ranks)"), said
    assert len(lines) == 4 and "loss is nan" not in said and "re-run" not in said, said


def test_the_micro_batch_of_the_step_that_went_non_finite_is_named(tmp_path):
    results = run(tmp_path, {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2},
                  "blocks.0.attn.qkv", 2, rank=0, micro_batch=1, phase="forward")
    said = said_about_the_step(results)
    assert said.count("non-finite gradients at step 3:") == 1, said
    assert "first non-finite output in forward order: blocks.0.attn.qkv (Linear) on rank 0, " \
           "micro-batch 2 of 2 of the step" in said, said


def test_a_gradient_that_goes_non_finite_in_the_backward_is_named_in_backward_order(tmp_path):
    results = run(tmp_path, {"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": 2},
                  "blocks.1.attn.qkv", 1, rank=1, micro_batch=0, phase="backward")
    said = said_about_the_step(results)
    assert said.count("non-finite gradients at step 2: the loss was finite") == 1, said
    assert "first non-finite gradient in backward order: in the backward of blocks.1.attn.qkv (Linear) on rank 1, " \
           "micro-batch 1 of 2 of the step (its output gradient was finite, the next checked, of " \
           "blocks.1.ln_1's output, was not)" in said, said


def test_by_default_trace_off_the_re_run_cannot_see_a_step_keyed_inf_and_says_how_to_once(tmp_path):
    results = run(tmp_path, {"zero_optimization": {"stage": 1}, "non_finite": {}}, "blocks.1.fc", 3,
                  rank=1, micro_batch=-1, phase="forward")
    said = said_about_the_step(results)
    assert "a re-run of the step's last micro-batch stayed finite on every rank" in said, said   # step-keyed
    assert 'to see it during the step: "non_finite": {"trace": true}' in said, said
    assert said.count("non-finite gradients at step 4:") == 1 and "loss is nan" not in said, said
