"""The DA tag parser: hand-worked rules, the paper's Acme example, and fuzzing against a reference."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollouts.protocol import PROTOCOL_VERSIONS, ProtocolParser, parse_completion, starting_state
from rollouts.protocol.parser import MAX_TAG_CHARS

from .reference_parser import MAX_TAG, reference_parse

ACME = (
    "<global>\nI need the founding year and the IPO year. The company history in Magic Chunk 2\n"
    "should state the founding.\n</global>\n"
    '<focus magic_chunks="2">"Acme Corp was founded in 2003 in San Jose."</focus>\n'
    '<focus magic_chunks="7">"Acme Corp went public on the NYSE in 2011."</focus>\n'
    "<local>2011 - 2003 = 8 years.</local>\n"
    "<answer>8 years</answer>"
)


def modes(parsed):
    return [(s.mode, s.chunks) for s in parsed.segments]


def kinds(parsed):
    return [v.kind for v in parsed.violations]


def test_acme_example_modes_and_offsets():
    p = parse_completion(ACME, num_chunks=7)
    assert modes(p) == [
        ("global", ()),
        ("focus", (2,)),
        ("global", ()),
        ("focus", (7,)),
        ("global", ()),
        ("local", ()),
        ("global", ()),
    ]
    # A tag's own text is predicted under the old mode: the new segment starts right after its '>'.
    focus2 = ACME.index('<focus magic_chunks="2">') + len('<focus magic_chunks="2">')
    close2 = ACME.index("</focus>") + len("</focus>")
    focus7 = ACME.index('<focus magic_chunks="7">') + len('<focus magic_chunks="7">')
    local = ACME.index("<local>") + len("<local>")
    close_local = ACME.index("</local>") + len("</local>")
    starts = [s.start for s in p.segments]
    assert starts == [
        0,
        focus2,
        close2,
        focus7,
        ACME.index("</focus>", focus7) + len("</focus>"),
        local,
        close_local,
    ]
    assert p.segments[-1].end == len(ACME)
    assert (
        ACME[p.segments[1].start : p.segments[1].end]
        == '"Acme Corp was founded in 2003 in San Jose."</focus>'
    )
    assert p.answer == "8 years"
    assert p.violations == []
    assert p.focused_chunks == (2, 7)


@pytest.mark.parametrize(
    ("text", "expected_modes", "expected_kinds"),
    [
        # ids: commas and/or spaces, single or double quotes, duplicates and order do not matter
        (
            "<focus magic_chunks='3 1,1'>x</focus><answer>a</answer>",
            [("global", ()), ("focus", (1, 3)), ("global", ())],
            [],
        ),
        (
            '<focus magic_chunks = " 2 , 4 ">x</focus><answer>a</answer>',
            [("global", ()), ("focus", (2, 4)), ("global", ())],
            [],
        ),
        # out-of-range ids are dropped with a violation each
        (
            '<focus magic_chunks="0,2,9">x</focus><answer>a</answer>',
            [("global", ()), ("focus", (2,)), ("global", ())],
            ["unknown_chunk", "unknown_chunk"],
        ),
        # nothing valid left -> local
        (
            '<focus magic_chunks="9">x</focus><answer>a</answer>',
            [("global", ()), ("local", ()), ("global", ())],
            ["unknown_chunk", "empty_focus"],
        ),
        (
            '<focus magic_chunks="two">x</focus><answer>a</answer>',
            [("global", ()), ("local", ()), ("global", ())],
            ["malformed_chunk_id", "empty_focus"],
        ),
        (
            "<focus>x</focus><answer>a</answer>",
            [("global", ()), ("local", ()), ("global", ())],
            ["empty_focus"],
        ),
        (
            '<focus magic_chunks="">x</focus><answer>a</answer>',
            [("global", ()), ("local", ()), ("global", ())],
            ["empty_focus"],
        ),
        # opening while open switches and records; closing with nothing open records
        (
            "<local>a<global>b</global><answer>a</answer>",
            [("global", ()), ("local", ()), ("global", ())],
            ["nested_mode"],
        ),
        ("</focus><answer>a</answer>", [("global", ())], ["unmatched_close"]),
        (
            "<local>a</focus>b<answer>a</answer>",
            [("global", ()), ("local", ()), ("global", ())],
            ["mismatched_close"],
        ),
        ("<local>a<answer>a</answer>", [("global", ()), ("local", ())], ["unclosed_mode"]),
        # plain text that looks like tags
        ("x < 3 and y > 2 <focused> <globalx> <answer>a</answer>", [("global", ())], []),
        ("<<local>>a</local><answer>a</answer>", [("global", ()), ("local", ()), ("global", ())], []),
    ],
)
def test_mode_rules(text, expected_modes, expected_kinds):
    p = parse_completion(text, num_chunks=5)
    assert modes(p) == expected_modes
    assert kinds(p) == expected_kinds


# -- version 2: a DA tag name opened but no tag completed is `malformed_tag` --------------------------

MALFORMED = [
    # (text, position of each malformed_tag): the door first, then each tag name and shape
    ('<focus magic_chunks="2">x</focus magic numbers here is: 219.</focus><answer>1</answer>', [25]),
    ("<global junk>x<answer>1</answer>", [0]),
    ("<local >x</local><answer>1</answer>", [0]),
    ("<answer junk<answer>1</answer>", [0]),
    ("<answer>1</answer >", [9]),
    ('<answer>1</answer>\n<focus magic_chunks="3"', [19]),  # the tag never ends: end of text
    ('<focus magic_chunks="3"<local>x</local><answer>1</answer>', [0]),  # '<' before its '>'
    ('<focus magic_chunks="1"' + " " * MAX_TAG_CHARS + ">x<answer>1</answer>", [0]),  # too long
    ('<focus"2">x<answer>1</answer>', [0]),  # a quote cannot continue the name
    ("x </global", [2]),
    ("<answer", [0]),
]


@pytest.mark.parametrize(("text", "positions"), MALFORMED)
def test_malformed_tags_are_violations_and_stay_text(text, positions):
    v2, v1 = parse_completion(text, 5, version=2), parse_completion(text, 5, version=1)
    assert [v.position for v in v2.violations if v.kind == "malformed_tag"] == positions
    # the only difference from version 1: the violations; the text, modes and answer are v1's
    assert [v for v in v2.violations if v.kind != "malformed_tag"] == v1.violations
    assert (modes(v2), v2.answer, v2.mode_tag_spans) == (modes(v1), v1.answer, v1.mode_tag_spans)
    assert "malformed_tag" not in kinds(v1)


def test_the_focus_padding_door_is_closed():
    """The embedded default's GRPO hack: the needle written twice in one focus, the second time after
    text that looks like a close but is not one. v1 reads it as compliant; v2 does not."""
    text = '<focus magic_chunks="2">is: 219.</focus magic numbers here is: 219.</focus><answer>219</answer>'
    assert kinds(parse_completion(text, 3, version=1)) == []
    assert kinds(parse_completion(text, 3)) == ["malformed_tag"]


@pytest.mark.parametrize(
    "text",
    [
        "x < 3 and y > 2 <answer>a</answer>",
        "<focused> <answers> <global_x> <local-2> <answer2> <focusing <answer>a</answer>",
        "<foc us> </glo bal> <ans <answer>a</answer>",  # the name is never complete
        "<<local>>a</local><answer>a</answer>",
        "<think junk><answer>a</answer>",  # <think> is no DA tag: its broken forms are text
        "<Answer>A</Answer><answer>a</answer>",  # names are case-sensitive
    ],
)
def test_other_names_and_plain_angle_brackets_stay_text(text):
    assert "malformed_tag" not in kinds(parse_completion(text, 5))
    assert "malformed_tag" not in kinds(parse_completion(text, 5, thinking=True))


def test_version_is_checked():
    for bad in (0, 6, "2", True, 2.0):
        with pytest.raises(ValueError, match="protocol version"):
            ProtocolParser(3, version=bad)


def test_answer_rules():
    assert parse_completion("<answer>  42 \n</answer>", 1).answer == "42"
    p = parse_completion("thinking out loud", 1)
    assert p.answer is None and kinds(p) == ["missing_answer"]
    p = parse_completion("<answer>1</answer> <answer>2</answer>", 1)
    assert p.answer == "1" and kinds(p) == ["multiple_answers"]
    p = parse_completion("<answer>1</answer>\n  and more", 1)
    assert p.answer == "1" and kinds(p) == ["text_after_answer"]
    assert p.violations[0].position == len("<answer>1</answer>\n  ")
    assert kinds(parse_completion("<answer>1</answer>\n \n", 1)) == []
    p = parse_completion("<answer>8 <local>years</answer></local>", 1)
    assert p.answer == "8 years" and kinds(p) == ["tag_in_answer"]  # </local> comes after the answer
    p = parse_completion("<answer>8 years", 1)
    assert p.answer == "8 years" and kinds(p) == ["unclosed_answer"]
    p = parse_completion("<answer>a<answer>b</answer>", 1)
    assert p.answer == "ab" and kinds(p) == ["nested_answer"]


def test_answer_does_not_change_mode():
    p = parse_completion("<local><answer>8</answer></local>", 1)
    assert modes(p) == [("global", ()), ("local", ())]
    assert p.answer == "8" and p.violations == []


def test_thinking_tags_change_nothing():
    text = '<think>\n<global>plan</global><focus magic_chunks="1">fact</focus>\n</think>\n<answer>x</answer>'
    thinking = parse_completion(text, 1, thinking=True)
    plain = parse_completion(text, 1, thinking=False)
    assert modes(thinking) == modes(plain) == [("global", ()), ("focus", (1,)), ("global", ())]
    assert thinking.violations == plain.violations == []
    assert thinking.answer == "x"


def test_over_long_focus_tag_is_text():
    long_tag = '<focus magic_chunks="1"' + " " * MAX_TAG_CHARS + ">"
    p = parse_completion(long_tag + "x<answer>a</answer>", 3, version=1)
    assert modes(p) == [("global", ())]
    assert MAX_TAG == MAX_TAG_CHARS
    p = parse_completion(long_tag + "x<answer>a</answer>", 3)  # version 2: text still, and a violation
    assert modes(p) == [("global", ())] and kinds(p) == ["malformed_tag"]


def test_state_changes_exactly_at_closing_bracket():
    parser = ProtocolParser(num_chunks=3)
    tag = '<focus magic_chunks="2">'
    for ch in tag[:-1]:
        assert parser.feed(ch).mode == "global"
    assert parser.feed(">") == ("focus", (2,))


def test_never_raises_on_garbage():
    for text in ["", "<", ">>>", "</", "<focus", '<focus magic_chunks="', "\x00\ud7ff<answer>", "<" * 1000]:
        for version in (1, 2, 3):
            p = parse_completion(text, 0, version=version)
            assert isinstance(p.violations, list)


# -- version 3: the index mode ---------------------------------------------------------------------


def test_index_mode_and_its_resting_state():
    """Hand-worked: with an index, every close returns to index; without one, to global."""
    text = '<index>5</index>\n<focus magic_chunks="5"> 63</focus>\n<answer> 63</answer>'
    with_index = parse_completion(text, 7, has_index=True)
    assert [(s.mode, s.chunks, s.start, s.end) for s in with_index.segments] == [
        ("global", (), 0, 7),  # `<index>` itself is predicted in the starting mode
        ("index", (), 7, 41),  # "5</index>\n<focus ...>"
        ("focus", (5,), 41, 52),
        ("index", (), 52, len(text)),  # the answer is written reading the index
    ]
    assert (with_index.answer, with_index.violations) == ("63", [])
    without = parse_completion(text, 7)  # v3, no index: a violation, and closes return to global
    assert [s.mode for s in without.segments] == ["global", "index", "global", "focus", "global"]
    assert kinds(without) == ["no_index"]


def test_index_tags_are_text_before_version_3():
    text = "<index>x</index><answer>1</answer>"
    assert modes(parse_completion(text, 2, version=2)) == [("global", ())]
    assert kinds(parse_completion(text, 2, version=2)) == []
    assert kinds(parse_completion("<index junk<answer>1</answer>", 2)) == ["malformed_tag"]
    assert kinds(parse_completion("<indexes><answer>1</answer>", 2)) == []
    with pytest.raises(ValueError, match="version 3"):
        ProtocolParser(2, version=2, has_index=True)


# -- fuzzing --------------------------------------------------------------------------------------

FRAGMENTS = [
    "<global>", "</global>", "<local>", "</local>", "</focus>", "<answer>", "</answer>", "<think>", "</think>",
    '<focus magic_chunks="', "<focus magic_chunks='", "<focus", "<focus>", " magic_chunks=", '"', "'", ">", "<", "</",
    "1", "2", "3", ",", " ", "\n", "x", "é", "<glob", "al>", "<ans", "wer>", "9", "<focused>", "abc", " \t",
    "</focus junk", "<global ", "<answer", "</answer", "<local", "</local", "-", "_", ".", "<answers>", "<focus\n",
    "<index>", "</index>", "<index", "</index junk", "<indexes>",
]  # fmt: skip

tag_soup = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=40).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=tag_soup,
    num_chunks=st.integers(0, 4),
    thinking=st.booleans(),
    version_index=st.sampled_from(
        [(1, False), (2, False), (3, False), (3, True), (4, False), (5, False), (5, True)]
    ),
)
def test_fuzz_matches_reference(text, num_chunks, thinking, version_index):
    version, has_index = version_index
    p = parse_completion(text, num_chunks, thinking=thinking, version=version, has_index=has_index)
    segments, answer, violations = reference_parse(text, num_chunks, thinking, version, has_index)
    assert [(s.mode, s.chunks, s.start, s.end) for s in p.segments] == segments
    assert p.answer == answer
    assert [(v.kind, v.position) for v in p.violations] == violations


@settings(max_examples=400, deadline=None)
@given(
    text=tag_soup,
    cuts=st.lists(st.integers(0, 200), max_size=12),
    thinking=st.booleans(),
    version_index=st.sampled_from(
        [(1, False), (2, False), (3, False), (3, True), (4, False), (5, False), (5, True)]
    ),
)
def test_fuzz_split_invariance(text, cuts, thinking, version_index):
    """Where the text is split into pieces never changes the result, nor the state at any cut."""
    version, has_index = version_index
    whole = parse_completion(text, 3, thinking=thinking, version=version, has_index=has_index)
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    parser = ProtocolParser(3, thinking=thinking, version=version, has_index=has_index)
    for a, b in itertools.pairwise(points):
        state = parser.feed(text[a:b])
        # the state after a prefix equals the state of a fresh parse of that prefix
        prefix = ProtocolParser(3, thinking=thinking, version=version, has_index=has_index)
        assert prefix.feed(text[:b]) == state
    result = parser.finish()
    assert result.segments == whole.segments
    assert result.answer == whole.answer
    assert result.violations == whole.violations


@settings(max_examples=200, deadline=None)
@given(text=tag_soup)
def test_fuzz_segments_tile_the_text(text):
    p = parse_completion(text, 3)
    assert all(s.end > s.start for s in p.segments)
    assert [s.start for s in p.segments[1:]] == [s.end for s in p.segments[:-1]]
    if text:
        assert p.segments[0].start == 0 and p.segments[-1].end == len(text)
    # adjacent segments differ (equal ones are merged)
    assert all(a.state != b.state for a, b in zip(p.segments, p.segments[1:]))


MODE_TAGS = ["<global>", "</global>", "<local>", "</local>", '<focus magic_chunks="2">', "<focus magic_chunks='1, 3'>",
             "</focus>", '<focus magic_chunks="">']  # fmt: skip
plain_text = st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.tuples(st.booleans(), st.sampled_from(MODE_TAGS), plain_text), max_size=20))
def test_fuzz_without_mode_tags_keeps_everything_else(pieces):
    """Text built from mode tags, plain text and answer tags: cutting the mode tags leaves exactly the
    rest, in order, however the tags nest or break the protocol."""
    text, rest = "", ""
    for is_tag, tag, words in pieces:
        piece = tag if is_tag else f"{words}<answer>{words}</answer>"
        text += piece
        rest += "" if is_tag else piece
    p = parse_completion(text, 3)
    assert p.without_mode_tags() == rest
    assert len(p.mode_tag_spans) == sum(is_tag for is_tag, _, _ in pieces)


# -- version 4: the local resting mode -------------------------------------------------------------


def test_version_4_rests_in_local_where_version_3_rests_in_global():
    """Hand-worked: the same completion, character offsets included; v4 changes only where closes lead."""
    text = '<global>Chunk 5.</global>\n<focus magic_chunks="5"> 63</focus>\n<answer> 63</answer>'
    spans = {
        3: [("global", (), 0, 50), ("focus", (5,), 50, 61), ("global", (), 61, len(text))],
        4: [
            ("global", (), 0, 25),  # "<global>Chunk 5.</global>": its tags are predicted in global
            ("local", (), 25, 50),  # "\n<focus ...>": the tag names the chunk the plan wrote
            ("focus", (5,), 50, 61),
            ("local", (), 61, len(text)),  # the answer reads no chunk
        ],
    }
    for version, expected in spans.items():
        parsed = parse_completion(text, 7, version=version)
        assert [(s.mode, s.chunks, s.start, s.end) for s in parsed.segments] == expected, version
        assert (parsed.answer, parsed.violations) == ("63", [])
    # decoding still starts in global, and the index rests in index whatever the version
    assert parse_completion("x<answer>1</answer>", 2, version=4).segments[0].mode == "global"
    with_index = parse_completion("<local>x</local><answer>1</answer>", 2, version=4, has_index=True)
    assert [s.mode for s in with_index.segments] == ["global", "local", "index"]
    # a close with nothing open still returns to the resting mode (and is a violation)
    stray = parse_completion("</focus>y<answer>1</answer>", 2, version=4)
    assert [s.mode for s in stray.segments] == ["global", "local"] and kinds(stray) == ["unmatched_close"]


# -- version 5: decoding starts in the resting mode ------------------------------------------------


def test_version_5_starts_where_closing_tags_lead():
    """Hand-worked: v5 differs from v4 only before the first tag completes."""
    text = '<global>Chunk 5.</global>\n<focus magic_chunks="5"> 63</focus>\n<answer> 63</answer>'
    parsed = parse_completion(text, 7, version=5)
    assert [(s.mode, s.chunks, s.start, s.end) for s in parsed.segments] == [
        ("local", (), 0, 8),  # "<global>": written before any chunk is visible
        ("global", (), 8, 25),  # "Chunk 5.</global>": the plan reads every chunk
        ("local", (), 25, 50),
        ("focus", (5,), 50, 61),
        ("local", (), 61, len(text)),
    ]
    assert (parsed.answer, parsed.violations) == ("63", [])
    # a focus written first is chosen without any chunk in view; an index prompt starts in the index
    blind = parse_completion('<focus magic_chunks="5"> 63</focus><answer> 63</answer>', 7, version=5)
    assert [s.mode for s in blind.segments] == ["local", "focus", "local"] and blind.violations == []
    assert parse_completion("x<answer>1</answer>", 2, version=5, has_index=True).segments[0].mode == "index"
    assert [starting_state(False, v).mode for v in PROTOCOL_VERSIONS] == ["global"] * 4 + ["local"]
