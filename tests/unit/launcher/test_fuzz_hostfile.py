"""The hostfile parser under generated input: every text gives hosts or a HostfileError naming the line.

Lines are built from DeepSpeed's shape (`[user@]host[:port] slots=N # remark`) and then mutated:
bad and huge slot counts, unicode digits, duplicate hosts, tabs, comments holding unicode line
separators, blank lines, stray text. tests/helpers/fuzz.py says how many examples run.
"""
import re

from hypothesis import assume, example, given, strategies as st

from launcher.errors import HostfileError
from launcher.planning.hostfile import MAX_SLOTS, parse_hostfile
from tests.helpers.fuzz import FUZZ, record

PATH = "hosts"
LINE_BREAK = re.compile(r"\r\n|\r|\n")    # the breaks an editor shows
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# characters str.splitlines() breaks on besides \n and \r: an editor shows them inside one line
ODD_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"

names = st.one_of(
    st.sampled_from(["worker-0", "worker-1", "w2", "gpu_3", "10.0.0.4", "node.example.com", "localhost"]),
    st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
    st.sampled_from(["-oProxyCommand=x", "w\x00", "wörker", "a,b", "x..y", "a" * 70, "h[1-2]", "$(id)", "."]),
    st.text(min_size=1, max_size=6),
)
slot_values = st.one_of(
    st.integers(1, 16).map(str),
    st.sampled_from(["0", "-1", "", "3x", "\u00b2", "\u0663", "٣٣", "1.5", "+2", " 2", "0x10",
                     str(MAX_SLOTS), str(MAX_SLOTS + 1), "9" * 30]),
    st.integers(-2**70, 2**70).map(str),
    st.text(max_size=4),
)
ports = st.one_of(st.none(), st.integers(-5, 70000).map(str), st.sampled_from(["", "\u00b2", "22a", "0"]))
users = st.one_of(st.none(), st.sampled_from(["admin", "root", "a b", "-l", "u\x00"]), st.text(max_size=4))
remarks = st.one_of(st.just(""), st.text(st.characters(exclude_characters="\r\n"), max_size=8).map(lambda t: " # " + t),
                    st.sampled_from(ODD_BREAKS).map(lambda c: f" # one{c}two"))
separators = st.sampled_from([" ", "\t", "  ", " \t "])


@st.composite
def host_lines(draw, name=None):
    """One line in the hostfile's shape, each part drawn from good and bad values."""
    host = name if name is not None else draw(names)
    user, port = draw(users), draw(ports)
    target = (f"{user}@" if user is not None else "") + host + (f":{port}" if port is not None else "")
    slots = draw(st.sampled_from(["slots={}", "slots = {}", "slots={} extra", "{}", "max_slots={}", "slots={}"]))
    line = target + draw(separators) + slots.format(draw(slot_values)) + draw(remarks)
    return draw(st.sampled_from(["", " ", "\t"])) + line + draw(st.sampled_from(["", " ", "\r"]))


good_lines = st.builds("{}{}slots={}{}".format, names.filter(lambda n: n.isascii() and n.isalnum()), separators,
                       st.integers(1, 16), remarks)
lines = st.one_of(good_lines, good_lines, host_lines(), st.sampled_from(["", "   ", "# a comment", "\t# x", "#"]), st.text(max_size=12))


def check_hosts(hosts, text):
    """What an accepted hostfile promises the planner and the runners."""
    seen = set()
    physical = LINE_BREAK.split(text)
    for host in hosts:
        assert host.name not in seen
        seen.add(host.name)
        assert 1 <= host.slots <= MAX_SLOTS
        assert SAFE_NAME.match(host.name), host       # safe on ssh's and pdsh's command line
        assert host.user is None or SAFE_NAME.match(host.user), host
        assert host.port is None or 0 < host.port < 65536
        assert host.name in physical[host.line - 1]    # the line an editor shows


def check_error(error, count):
    message = error.message
    assert message.startswith(f"{PATH}:"), message
    number = re.match(rf"{PATH}:(\d+):", message)
    assert number or "no hosts" in message, message
    if number:
        assert 1 <= int(number.group(1)) <= count, message
    assert error.hint


@FUZZ
@given(st.lists(lines, max_size=8), st.sampled_from(["\n", "\r\n"]))
@example(["w0 slots=\u00b2"], "\n")                    # int('²') raised ValueError
@example(["w0:\u00b2 slots=1"], "\n")                  # so did a port of '²'
@example(["w0 slots=99999999999"], "\n")               # accepted: the plan then built a list that long
@example(["w\x00 slots=1"], "\n")                      # accepted: Popen (ssh -G) raised 'embedded null byte'
@example(["-oProxyCommand=x slots=1"], "\n")           # accepted: ssh read the host as an option
@example(["w0 slots=1 # a\u2028b", "w1 slots=x"], "\n")  # the error named line 3, the editor's line 2
def test_a_hostfile_gives_hosts_or_names_its_line(items, newline):
    text = newline.join(items)
    try:
        hosts = parse_hostfile(text, PATH)
    except HostfileError as error:
        record("hostfile", error)
        check_error(error, len(LINE_BREAK.split(text)))
        return
    record("hostfile")
    check_hosts(hosts, text)


BAD_LINES = st.one_of(
    st.builds("{} slots={}".format, st.just("bad"), st.sampled_from(["0", "-2", "x", "\u00b2", "", "1e3", "9" * 25])),
    st.builds("bad:{} slots=1".format, st.sampled_from(["0", "70000", "\u00b2", "p", "-1"])),
    st.sampled_from(["bad", "bad slots = 2", "bad 4", "bad slots=2 more", "a@b@c slots=1", "bad cores=2",
                     "-bad slots=1", "b\x00d slots=1", "bäd slots=1", "bad,x slots=1"]),
)


@FUZZ
@given(st.lists(st.from_regex(r"w[0-9]{1,3}", fullmatch=True), unique=True, min_size=1, max_size=6),
       st.data())
@example(["w0"], None)
def test_the_one_bad_line_is_the_one_named(good, data):
    """Good lines, blank lines and comments around one bad line: the error names that line."""
    if data is None:   # the regression: a comment holding U+2028 counted as two lines
        text, bad_number = "w0 slots=1 # see\u2028below\nbad slots=0", 2
    else:
        rows = [f"{name} slots={data.draw(st.integers(1, 8))}" + data.draw(remarks) for name in good]
        rows += data.draw(st.lists(st.sampled_from(["", "# c", "  "]), max_size=3))
        rows = data.draw(st.permutations(rows))
        bad = data.draw(st.one_of(BAD_LINES, st.sampled_from(good).map(lambda n: f"{n} slots=1")))
        at = data.draw(st.integers(0, len(rows)))
        if bad.split()[0] in good:       # a duplicate is named where it repeats: after the first
            first = next(i for i, row in enumerate(rows) if row.split()[:1] == bad.split()[:1])
            assume(at > first)
        rows.insert(at, bad)
        text, bad_number = "\n".join(rows), at + 1
    try:
        parse_hostfile(text, PATH)
    except HostfileError as error:
        record("hostfile_bad_line", error)
        assert error.message.startswith(f"{PATH}:{bad_number}: "), (text, error.message)
        return
    raise AssertionError(f"accepted a bad line: {text!r}")
