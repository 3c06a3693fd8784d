""".deepspeed_env and --env under generated lines: a mapping a process can be given, or an EnvFileError naming the line.

Lines are `[export ]KEY=VALUE` with mutations: no '=', bad keys, quotes (matched, unmatched,
mixed), '=' inside values, comments, blank lines, unicode line separators, NUL.
"""
import re

from hypothesis import example, given, strategies as st

from launcher.errors import EnvFileError
from launcher.planning.envpolicy import parse_env_file, parse_env_options
from tests.helpers.fuzz import FUZZ, record

PATH = "/home/u/.deepspeed_env"
LINE_BREAK = re.compile(r"\r\n|\r|\n")
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

keys = st.one_of(st.sampled_from(["NCCL_DEBUG", "PYTHONPATH", "_X", "A1"]),
                 st.sampled_from(["", "1A", "A-B", "A B", "É", "A\x00", " A", "export"]), st.text(max_size=4))
values = st.one_of(st.sampled_from(["INFO", "", "a=b", "'q'", '"q"', "'", '"x\'', "a b", " pad ", "#no", "x\x00y",
                                    "é", "\u2028", "$HOME"]), st.text(max_size=6))


@st.composite
def env_lines(draw):
    prefix = draw(st.sampled_from(["", "", "export ", "export  ", "EXPORT ", " "]))
    sep = draw(st.sampled_from(["=", "=", " = ", ":", ""]))
    return prefix + draw(keys) + sep + draw(values)


lines = st.one_of(env_lines(), env_lines(), st.sampled_from(["", "# comment", "  #x=1", "\t"]), st.text(max_size=8))


def check_usable(mapping):
    """What Popen(env=...) takes: keys a shell can export, no NUL anywhere."""
    for key, value in mapping.items():
        assert KEY.match(key), key
        assert "\x00" not in value, (key, value)


@FUZZ
@given(st.lists(lines, max_size=8))
@example(["NCCL_DEBUG=IN\x00FO"])                # accepted: Popen(env=...) raised 'embedded null byte' at launch
@example(["A=1 # x\u2028B"])                     # the U+2028 in a value broke the line: 'B' was named as line 2
def test_an_env_file_gives_a_mapping_or_names_its_line(items):
    text = "\n".join(items)
    try:
        mapping = parse_env_file(text, PATH)
    except EnvFileError as error:
        record("env_file", error)
        number = re.match(rf"{re.escape(PATH)}:(\d+): ", error.message)
        assert number and 1 <= int(number.group(1)) <= len(LINE_BREAK.split(text)), error.message
        assert error.hint
        return
    record("env_file")
    check_usable(mapping)


@FUZZ
@given(st.lists(env_lines(), max_size=4))
@example(("A=\x00",))
def test_env_options_give_a_mapping_or_name_the_flag(items):
    try:
        mapping = parse_env_options(tuple(items))
    except EnvFileError as error:
        record("env_option", error)
        assert error.message.startswith("--env: "), error.message
        return
    record("env_option")
    check_usable(mapping)
