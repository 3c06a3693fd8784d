"""The environment forwarding policy and env files."""
import pytest

from launcher.planning.envpolicy import env_file_paths, forwarded, is_forwarded, parse_env_file, read_env_files
from launcher.errors import EnvFileError


@pytest.mark.parametrize("name, expected", [
    ("NCCL_DEBUG", True), ("GLOO_SOCKET_IFNAME", True), ("TORCH_SHOW_CPP_STACKTRACES", True),
    ("CUDA_HOME", True), ("CUDA_VISIBLE_DEVICES", False), ("PYTHONPATH", True), ("OMP_NUM_THREADS", True),
    ("MKL_NUM_THREADS", True), ("HF_HOME", True), ("WANDB_API_KEY", True), ("UCX_TLS", True),
    ("FI_PROVIDER", True), ("PATH", True), ("LD_LIBRARY_PATH", True), ("VIRTUAL_ENV", True),
    ("CONDA_PREFIX", True), ("CONDA_DEFAULT_ENV", True), ("HOME", False), ("SSH_AUTH_SOCK", False),
    ("AWS_SECRET_ACCESS_KEY", False), ("PATHX", False),
])
def test_policy(name, expected):
    assert is_forwarded(name) is expected


def test_forwarded_subset():
    assert forwarded({"PATH": "/b", "HOME": "/r", "NCCL_X": "1"}) == {"NCCL_X": "1", "PATH": "/b"}


def test_env_file_comments_blank_lines_and_quotes():
    text = "# comment\n\nNCCL_DEBUG=INFO\nexport A='x y'\nB=\"q\"\nC=a=b\n  D = 1\n"
    assert parse_env_file(text, "f") == {"NCCL_DEBUG": "INFO", "A": "x y", "B": "q", "C": "a=b", "D": " 1"}


@pytest.mark.parametrize("line", ["JUSTAKEY", "=value", "1BAD=x", "A B=c"])
def test_env_file_bad_line_names_file_and_line(line):
    with pytest.raises(EnvFileError, match=r"f:2: expected KEY=VALUE"):
        parse_env_file("OK=1\n" + line + "\n", "f")


def test_env_files_later_wins(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    (home / ".deepspeed_env").write_text("A=home-ds\nB=home-ds\n")
    (home / ".dslaunch_env").write_text("B=home-dsl\n")
    (cwd / ".deepspeed_env").write_text("C=cwd-ds\n# c\n\n")
    paths = env_file_paths(str(home), str(cwd))
    values, used = read_env_files(paths)
    assert values == {"A": "home-ds", "B": "home-dsl", "C": "cwd-ds"}
    assert len(used) == 3
