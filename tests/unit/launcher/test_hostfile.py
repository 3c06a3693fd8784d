"""Hostfile parsing: DeepSpeed's format, stricter where DeepSpeed guesses silently."""
import pytest

from launcher.errors import HostfileError
from launcher.planning.hostfile import Host, load_hostfile, parse_hostfile


@pytest.mark.parametrize("text, expected", [
    ("worker-0 slots=4\nworker-1 slots=2\n", [("worker-0", 4, None, None), ("worker-1", 2, None, None)]),
    ("# cluster\n\n  w0 slots=1  \n\t\nw1\tslots=8\n", [("w0", 1, None, None), ("w1", 8, None, None)]),
    ("admin@w0 slots=2\nw1:2222 slots=2\nroot@w2:22 slots=1\n",
     [("w0", 2, "admin", None), ("w1", 2, None, 2222), ("w2", 1, "root", 22)]),
    ("w0 slots=2 # two GPUs\n", [("w0", 2, None, None)]),
    ("10.0.0.1 slots=8\n", [("10.0.0.1", 8, None, None)]),
])
def test_good_hostfiles(text, expected):
    hosts = parse_hostfile(text, "hosts")
    assert [(h.name, h.slots, h.user, h.port) for h in hosts] == expected


def test_order_and_line_numbers_are_kept():
    hosts = parse_hostfile("# c\nb slots=1\na slots=1\n", "hosts")
    assert [h.name for h in hosts] == ["b", "a"]
    assert [h.line for h in hosts] == [2, 3]


@pytest.mark.parametrize("text, message", [
    ("missingslots\n", "hosts:1: bad line 'missingslots'"),
    ("w slots = 3\n", "hosts:1: bad line"),
    ("w slots=-1\n", "hosts:1: slots must be a whole number >= 1, got '-1'"),
    ("w slots=0\n", "slots must be a whole number >= 1, got '0'"),
    ("w slots=3x\n", "got '3x'"),
    ("w slots=\n", "got ''"),
    ("this is bad slots=1\n", "hosts:1: bad line"),
    ("w slots=2 extra\n", "hosts:1: unexpected text after slots: 'extra'"),
    ("w slots=2\tmax_slots=4\n", "unexpected text after slots"),
    ("a slots=1\n\nb slots=1\na slots=2\n", "hosts:4: duplicate host 'a' (first on line 1)"),
    ("", "hosts: no hosts"),
    ("# only a comment\n\n", "no hosts"),
    ("w:99999 slots=1\n", "bad port '99999'"),
    ("a@b@c slots=1\n", "bad host 'a@b@c'"),
])
def test_bad_hostfiles_name_file_and_line(text, message):
    with pytest.raises(HostfileError) as info:
        parse_hostfile(text, "hosts")
    assert message in info.value.message
    assert info.value.exit_code == 2


def test_named_missing_hostfile_is_an_error_not_a_local_run(tmp_path):
    with pytest.raises(HostfileError, match="does not exist"):
        load_hostfile(str(tmp_path / "nope"))


def test_no_hostfile_named_and_no_default_means_local(monkeypatch, tmp_path):
    monkeypatch.setattr("launcher.planning.hostfile.DEFAULT_HOSTFILE", str(tmp_path / "absent"))
    assert load_hostfile(None) == (None, None)


def test_directory_is_an_error(tmp_path):
    with pytest.raises(HostfileError, match="is a directory"):
        load_hostfile(str(tmp_path))


def test_ssh_target():
    assert Host("w0", 1, user="me").ssh_target == "me@w0"
    assert Host("w0", 1).ssh_target == "w0"


HINTS = [  # (line, the hint that fits it)
    ("w slot=2\n", "the key is 'slots': write 'slots=2' (not 'slot')"),
    ("w gpus=8\n", "the key is 'slots': write 'slots=8' (not 'gpus')"),
    ("w 4\n", "write 'slots=4'"),
    ("w slots = 3\n", "write 'slots=N' with no spaces around '='"),
    ("w slots =3\n", "write 'slots=N' with no spaces around '='"),
]


def test_a_bad_slots_word_gets_the_hint_that_fits_it():
    for text, hint in HINTS:
        with pytest.raises(HostfileError) as info:
            parse_hostfile(text, "hosts")
        assert info.value.hint == hint, text
