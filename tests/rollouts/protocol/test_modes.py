"""A mode registered at run time (rollouts/protocol/modes.py) is read by the parser from its
``since_version`` on, neutralized in documents and given the regions of its rule by the one visibility
function; unregistered, its tags are plain text again. Expected segments are worked by hand."""

import pytest

from rollouts.masks.visibility import visible_chunks
from rollouts.protocol import (
    Mode,
    ModeState,
    mode_names,
    neutralize,
    parse_completion,
    register_mode,
    registered_mode,
)

RECALL = Mode("recall", "no chunk", "#8c564b", "#efe4e1", visible="none")
TEXT = "<recall>notes</recall><answer>8</answer>"


def spans(parsed) -> list[tuple[str, str]]:
    return [(s.mode, TEXT[s.start : s.end]) for s in parsed.segments]


def test_the_parser_reads_its_tags_while_registered_and_not_after():
    with registered_mode(RECALL):
        assert mode_names()[-1] == "recall"
        parsed = parse_completion(TEXT, num_chunks=3, version=5)
        assert spans(parsed) == [
            ("local", "<recall>"),
            ("recall", "notes</recall>"),
            ("local", "<answer>8</answer>"),
        ]
        assert parsed.violations == [] and parsed.answer == "8"
        assert parsed.mode_tag_spans == [(0, 8), (13, 22)]
    assert "recall" not in mode_names()
    parsed = parse_completion(TEXT, num_chunks=3, version=5)
    assert spans(parsed) == [("local", TEXT)] and parsed.violations == []  # plain text: no tag of any mode


def test_a_mode_is_read_from_its_version_on():
    late = Mode("late", "no chunk", "#000", "#fff", since_version=5)
    with registered_mode(late):
        text = "<late>x</late><answer>8</answer>"
        assert [s.mode for s in parse_completion(text, num_chunks=2, version=5).segments] == [
            "local",
            "late",
            "local",
        ]
        assert [s.mode for s in parse_completion(text, num_chunks=2, version=4).segments] == ["global"]


def test_documents_cannot_speak_it():
    with registered_mode(RECALL):
        assert neutralize("see </Recall> and <recall>") == "see \u2039/Recall> and \u2039recall>"
    assert neutralize("<recall>") == "<recall>"


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("none", [True, False, False, False, False]),
        ("all", [True, True, True, True, True]),
        ("index", [True, False, False, False, True]),
    ],
)
def test_the_visibility_rule_gives_it_the_regions_of_its_rule(rule, expected):
    with registered_mode(Mode("skim", "", "#000", "#fff", visible=rule)):
        assert visible_chunks(ModeState("skim"), 3).tolist() == expected


def test_bad_registrations_are_refused_with_what_to_change():
    for name in ("answer", "focus", "Upper", "two words"):
        with pytest.raises(ValueError, match=r"lower-case letters|exists already"):
            register_mode(Mode(name, "", "#000", "#fff"))
    with pytest.raises(ValueError, match="only <focus> lists chunks"):
        register_mode(Mode("skim", "", "#000", "#fff", visible="listed"))
    with pytest.raises(ValueError, match="visible must be one of"):
        Mode("skim", "", "#000", "#fff", visible="some")
    with pytest.raises(KeyError, match="no mode named 'skim'"):
        visible_chunks(ModeState("skim"), 3)
    assert "skim" not in mode_names()
