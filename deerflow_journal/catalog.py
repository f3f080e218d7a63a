"""The run event catalog: every event name and category this package writes.

Names and categories are frozen wire facts shared with the JSON contract in
``contracts/run_event_stream_contract.json``; the conformance tests keep the two identical.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CANCELLED_ERROR_TYPES",
    "FIXED_RUN_EVENT_DEFINITIONS",
    "JOURNAL_RUN_EVENT_DEFINITIONS",
    "LEGACY_EVENT_ALIASES",
    "LLM_AI_RESPONSE_EVENT",
    "LLM_ERROR_EVENT",
    "LLM_HUMAN_INPUT_EVENT",
    "LLM_TOOL_RESULT_EVENT",
    "MEMORY_CONTEXT_EVENT",
    "MIDDLEWARE_EVENT_PATTERN",
    "MIDDLEWARE_EVENT_TAGS",
    "MIDDLEWARE_EVENT_TAG_MAX_LENGTH",
    "MIDDLEWARE_GUARDRAIL_TAG",
    "MIDDLEWARE_SAFETY_TERMINATION_TAG",
    "MIDDLEWARE_SKILL_ACTIVATION_TAG",
    "MIDDLEWARE_SKILL_SECRETS_TAG",
    "RUN_END_EVENT",
    "RUN_ERROR_EVENT",
    "RUN_EVENT_CATEGORIES",
    "RUN_EVENT_CATEGORY_MAX_LENGTH",
    "RUN_EVENT_TYPE_MAX_LENGTH",
    "RUN_INTERRUPT_EVENT",
    "RUN_RESUME_EVENT",
    "RUN_START_EVENT",
    "SUBAGENT_END_EVENT",
    "SUBAGENT_RUN_EVENT_DEFINITIONS",
    "SUBAGENT_START_EVENT",
    "SUBAGENT_STEP_EVENT",
    "TOOL_ERROR_EVENT",
    "TOOL_UNRESOLVED_EVENT",
    "WORKSPACE_CHANGES_EVENT",
    "WORKSPACE_RUN_EVENT_DEFINITIONS",
    "RunEventDefinition",
    "RunEventPattern",
    "is_middleware_caller",
]

RUN_EVENT_TYPE_MAX_LENGTH = 32
RUN_EVENT_CATEGORY_MAX_LENGTH = 16

#: Every category a catalog event may use, with what consumers route on it.
RUN_EVENT_CATEGORIES = (
    "message",
    "trace",
    "outputs",
    "error",
    "middleware",
    "context",
    "subagent",
    "workspace",
)


def _check_text(value: object, what: str, max_length: int) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"event {what} must be a non-empty string, got {value!r}")
    if len(value) > max_length:
        raise ValueError(
            f"event {what} {value!r} is {len(value)} characters; the limit is {max_length}"
        )


@dataclass(frozen=True, slots=True)
class RunEventDefinition:
    """A fixed event name and the category it is always written with."""

    event_type: str
    category: str

    def __post_init__(self) -> None:
        _check_text(self.event_type, "type", RUN_EVENT_TYPE_MAX_LENGTH)
        _check_text(self.category, "category", RUN_EVENT_CATEGORY_MAX_LENGTH)


@dataclass(frozen=True, slots=True)
class RunEventPattern:
    """An open family of event names, ``prefix + suffix``, sharing one category."""

    pattern: str
    prefix: str
    category: str

    def __post_init__(self) -> None:
        _check_text(self.prefix, "type prefix", RUN_EVENT_TYPE_MAX_LENGTH - 1)
        _check_text(self.category, "category", RUN_EVENT_CATEGORY_MAX_LENGTH)

    @property
    def suffix_max_length(self) -> int:
        """The longest suffix that keeps the full name within the type limit."""
        return RUN_EVENT_TYPE_MAX_LENGTH - len(self.prefix)

    def event_type(self, suffix: str) -> str:
        """Return the full event name for ``suffix``; ``ValueError`` if its length is off."""
        if not isinstance(suffix, str) or not 1 <= len(suffix) <= self.suffix_max_length:
            raise ValueError(
                f"{self.pattern} suffix must be a string of 1 to {self.suffix_max_length} "
                f"characters, got {suffix!r}"
            )
        return self.prefix + suffix


RUN_START_EVENT = RunEventDefinition("run.start", "trace")
RUN_END_EVENT = RunEventDefinition("run.end", "outputs")
RUN_ERROR_EVENT = RunEventDefinition("run.error", "error")
RUN_INTERRUPT_EVENT = RunEventDefinition("run.interrupt", "outputs")
RUN_RESUME_EVENT = RunEventDefinition("run.resume", "trace")
LLM_HUMAN_INPUT_EVENT = RunEventDefinition("llm.human.input", "message")
LLM_AI_RESPONSE_EVENT = RunEventDefinition("llm.ai.response", "message")
LLM_TOOL_RESULT_EVENT = RunEventDefinition("llm.tool.result", "message")
LLM_ERROR_EVENT = RunEventDefinition("llm.error", "trace")
TOOL_ERROR_EVENT = RunEventDefinition("tool.error", "error")
TOOL_UNRESOLVED_EVENT = RunEventDefinition("tool.unresolved", "trace")
MEMORY_CONTEXT_EVENT = RunEventDefinition("context:memory", "context")
SUBAGENT_START_EVENT = RunEventDefinition("subagent.start", "subagent")
SUBAGENT_STEP_EVENT = RunEventDefinition("subagent.step", "subagent")
SUBAGENT_END_EVENT = RunEventDefinition("subagent.end", "subagent")
WORKSPACE_CHANGES_EVENT = RunEventDefinition("workspace_changes", "workspace")

MIDDLEWARE_EVENT_PATTERN = RunEventPattern("middleware:{tag}", "middleware:", "middleware")
MIDDLEWARE_EVENT_TAG_MAX_LENGTH = MIDDLEWARE_EVENT_PATTERN.suffix_max_length
MIDDLEWARE_GUARDRAIL_TAG = "guardrail"
MIDDLEWARE_SAFETY_TERMINATION_TAG = "safety_termination"
MIDDLEWARE_SKILL_ACTIVATION_TAG = "skill_activation"
MIDDLEWARE_SKILL_SECRETS_TAG = "skill_secrets"
MIDDLEWARE_EVENT_TAGS = (
    MIDDLEWARE_GUARDRAIL_TAG,
    MIDDLEWARE_SAFETY_TERMINATION_TAG,
    MIDDLEWARE_SKILL_ACTIVATION_TAG,
    MIDDLEWARE_SKILL_SECRETS_TAG,
)


def is_middleware_caller(caller: object) -> bool:
    """Whether an event's ``metadata.caller`` names a middleware (``middleware:{tag}``)."""
    return isinstance(caller, str) and caller.startswith(MIDDLEWARE_EVENT_PATTERN.prefix)


JOURNAL_RUN_EVENT_DEFINITIONS = (
    RUN_START_EVENT,
    RUN_END_EVENT,
    RUN_ERROR_EVENT,
    RUN_INTERRUPT_EVENT,
    RUN_RESUME_EVENT,
    LLM_HUMAN_INPUT_EVENT,
    LLM_AI_RESPONSE_EVENT,
    LLM_TOOL_RESULT_EVENT,
    LLM_ERROR_EVENT,
    TOOL_ERROR_EVENT,
    TOOL_UNRESOLVED_EVENT,
    MEMORY_CONTEXT_EVENT,
)
SUBAGENT_RUN_EVENT_DEFINITIONS = (SUBAGENT_START_EVENT, SUBAGENT_STEP_EVENT, SUBAGENT_END_EVENT)
WORKSPACE_RUN_EVENT_DEFINITIONS = (WORKSPACE_CHANGES_EVENT,)
FIXED_RUN_EVENT_DEFINITIONS = (
    JOURNAL_RUN_EVENT_DEFINITIONS + SUBAGENT_RUN_EVENT_DEFINITIONS + WORKSPACE_RUN_EVENT_DEFINITIONS
)

#: Historical names readers still recognise; no producer may write them.
LEGACY_EVENT_ALIASES = {"ai_message": LLM_AI_RESPONSE_EVENT.event_type}

#: ``error_type`` values of a ``run.error`` whose run was stopped (status ``cancelled``), not
#: failed: a cancelled task, a stream closed early, Ctrl-C, ``sys.exit()``.
CANCELLED_ERROR_TYPES = frozenset(
    {"CancelledError", "GeneratorExit", "KeyboardInterrupt", "SystemExit"}
)
