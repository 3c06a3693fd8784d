"""The 3D example GPT (pipeline 2 x tensor 2) trains the same with and without --sequence-parallel."""
import re

from tests.helpers.world import REPO, check, run_world


def losses(*flags):
    results = check(run_world(REPO / "examples" / "train_gpt.py", 4, "--pipeline", "2", "--tensor", "2",
                              "--config", str(REPO / "examples" / "configs" / "pipe3d.json"), "--steps", "8",
                              "--block_size", "32", *flags, timeout=240))
    text = results[0].stdout
    assert f"sequence_parallel={bool(flags)}" in text, text
    found = re.search(r"last loss ([\d.]+).*\n.*first loss ([\d.]+) .* val loss ([\d.]+)", text)
    return [float(v) for v in found.groups()]


def test_sequence_parallel_gpt3d_matches_the_plain_tensor_parallel_run():
    plain, sequence = losses(), losses("--sequence-parallel")
    print("pipe 2 x tensor 2, (last, first, val) loss: plain", plain, "sequence parallel", sequence)
    assert all(abs(a - b) <= 1.5e-4 for a, b in zip(plain, sequence)), (plain, sequence)
    assert sequence[0] < sequence[1]          # 8 steps of training moved the loss
