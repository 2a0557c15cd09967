"""The DA protocol: prompt layout, the streaming tag parser and its mode states."""

from .instructions import PROTOCOL_VERSION, PROTOCOL_VERSIONS, system_instructions
from .layout import DEFAULT_LAYOUT, LayoutError, LayoutSettings, PromptLayout, build_prompt
from .modes import MODE_BY_NAME, MODE_TABLE, Mode
from .neutralize import neutralize
from .parser import (
    GLOBAL_STATE,
    INDEX_STATE,
    LOCAL_STATE,
    MODES,
    PROTOCOL_TAG_TOKENS,
    VIOLATION_KINDS,
    ModeState,
    ParsedCompletion,
    ProtocolParser,
    Segment,
    Violation,
    parse_completion,
    resting_state,
    starting_state,
)
from .tokens import TokenTextStream, token_bytes_table

__all__ = [
    "DEFAULT_LAYOUT",
    "GLOBAL_STATE",
    "INDEX_STATE",
    "LOCAL_STATE",
    "MODES",
    "MODE_BY_NAME",
    "MODE_TABLE",
    "PROTOCOL_TAG_TOKENS",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSIONS",
    "VIOLATION_KINDS",
    "LayoutError",
    "LayoutSettings",
    "Mode",
    "ModeState",
    "ParsedCompletion",
    "PromptLayout",
    "ProtocolParser",
    "Segment",
    "TokenTextStream",
    "Violation",
    "build_prompt",
    "neutralize",
    "parse_completion",
    "resting_state",
    "starting_state",
    "system_instructions",
    "token_bytes_table",
]
