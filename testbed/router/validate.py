"""What the router accepts: a schema per endpoint body and for the ``x-*`` headers.

Everything a client sends is checked here, before any server sees it: types (a
``stream`` that is not a boolean, a list ``max_tokens``, messages that are strings),
ranges (token ids within the vocabulary, output within the context), ids the router
reserves for itself, and the model name. A failure is a :class:`Rejected` with the
HTTP status and a message naming the field; unknown fields pass through to SGLang
untouched (it has many sampling options the router need not know).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from protocol import headers
from protocol.names import HandoffMode, Pipeline
from protocol.rooms import RESERVED_PREFIXES

Number = StrictInt | StrictFloat
MAX_ID_CHARS = 200  # session and request ids


class Rejected(ValueError):
    """A request the router refuses, with the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


class RequestLimits(BaseModel):
    """What the served model and the router can take (filled in by the deployment)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    vocab_size: int | None = Field(None, gt=0, description="Token ids must be below this.")
    context_tokens: int | None = Field(
        None, gt=0, description="Prompt plus output tokens must fit in this."
    )
    served_models: tuple[str, ...] = Field(
        (), description="Model names the router answers to (empty: any)."
    )
    max_body_bytes: int = Field(16 << 20, gt=0, description="Largest request body.")
    max_in_flight: int = Field(
        512, gt=0, description="Requests in flight past which the router answers 503."
    )


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


class SamplingParams(_Open):
    max_new_tokens: StrictInt | None = Field(None, ge=0)
    temperature: Number | None = Field(None, ge=0)
    top_p: Number | None = Field(None, gt=0, le=1)
    top_k: StrictInt | None = None
    ignore_eos: StrictBool | None = None
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt | None = Field(None, ge=1, le=1)  # one stream per request


class GenerateBody(_Open):
    text: StrictStr | None = None
    input_ids: list[StrictInt] | None = Field(None, min_length=1)
    sampling_params: SamplingParams | None = None
    stream: StrictBool = False
    rid: StrictStr | None = None


class CompletionBody(_Open):
    model: StrictStr | None = None
    prompt: StrictStr | list[StrictInt] = Field(..., min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=0)
    temperature: Number | None = Field(None, ge=0)
    top_p: Number | None = Field(None, gt=0, le=1)
    n: StrictInt | None = Field(None, ge=1, le=1)
    stream: StrictBool = False
    rid: StrictStr | None = None


class Message(_Open):
    role: StrictStr = Field(..., min_length=1)
    content: StrictStr | list[dict] | None = None


class ChatBody(_Open):
    model: StrictStr | None = None
    messages: list[Message] = Field(..., min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=0)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    temperature: Number | None = Field(None, ge=0)
    top_p: Number | None = Field(None, gt=0, le=1)
    n: StrictInt | None = Field(None, ge=1, le=1)
    stream: StrictBool = False
    rid: StrictStr | None = None


BODIES: dict[str, type[_Open]] = {
    "/generate": GenerateBody,
    "/v1/completions": CompletionBody,
    "/v1/chat/completions": ChatBody,
}


@dataclass(frozen=True)
class RequestHeaders:
    """The ``x-*`` headers, parsed."""

    session: str | None = None
    turn: int | None = None
    request_id: str | None = None
    pipeline: Pipeline | None = None
    handoff_at: int | None = None
    handoff_mode: HandoffMode | None = None


def check_body(path: str, body: object, limits: RequestLimits) -> None:
    """Raise :class:`Rejected` unless ``body`` is a request the endpoint can serve."""
    if not isinstance(body, dict):
        raise Rejected("request body must be a JSON object")
    try:
        parsed = BODIES[path].model_validate(body)
    except ValidationError as exc:
        raise Rejected(_say(exc)) from None
    rid = parsed.rid
    if rid is not None and rid.startswith(RESERVED_PREFIXES):
        raise Rejected(f"rid: ids starting {' or '.join(RESERVED_PREFIXES)} are the router's")
    if isinstance(parsed, GenerateBody):
        if (parsed.text is None) == (parsed.input_ids is None):
            raise Rejected("give exactly one of text and input_ids (one prompt per request)")
        ids = parsed.input_ids
        params = parsed.sampling_params
        out = params.max_new_tokens if params is not None else None
    else:
        _check_model(parsed.model, limits)
        ids = parsed.prompt if isinstance(parsed, CompletionBody) else None
        if isinstance(ids, str):
            ids = None
        out = parsed.max_tokens
        if isinstance(parsed, ChatBody) and out is None:
            out = parsed.max_completion_tokens
    if ids is not None:
        _check_ids(ids, out, limits)
    elif out is not None and limits.context_tokens is not None and out >= limits.context_tokens:
        raise Rejected(f"{out} output tokens do not fit the {limits.context_tokens}-token context")


def check_headers(found) -> RequestHeaders:
    """The ``x-*`` headers of a request (``found``: a case-insensitive mapping)."""
    return RequestHeaders(
        session=_id(found, headers.SESSION),
        turn=_int(found, headers.TURN, low=0),
        request_id=_id(found, headers.REQUEST_ID),
        pipeline=_choice(found, headers.PIPELINE, Pipeline),
        handoff_at=_int(found, headers.HANDOFF_AT, low=1),
        handoff_mode=_choice(
            found, headers.HANDOFF_MODE, HandoffMode, (HandoffMode.ONE_SHOT, HandoffMode.CATCH_UP)
        ),
    )


def _check_ids(ids: list[int], out: int | None, limits: RequestLimits) -> None:
    bad = [t for t in ids if t < 0 or (limits.vocab_size is not None and t >= limits.vocab_size)]
    if bad:
        vocab = f"[0, {limits.vocab_size})" if limits.vocab_size else "non-negative"
        raise Rejected(f"{len(bad)} token ids outside the vocabulary {vocab}, e.g. {bad[0]}")
    context = limits.context_tokens
    need = len(ids) + (out if out is not None else 1)
    if context is not None and need > context:
        raise Rejected(
            f"{len(ids)} prompt tokens + {out or 1} output tokens exceed the model's "
            f"{context}-token context"
        )


def _check_model(model: str | None, limits: RequestLimits) -> None:
    if model is None or not limits.served_models or model in limits.served_models:
        return
    known = ", ".join(limits.served_models)
    raise Rejected(f"model {model!r} is not served here (served: {known})", 404, "not_found_error")


def _say(exc: ValidationError) -> str:
    """A pydantic error as one line naming the fields."""
    parts = []
    for e in exc.errors()[:3]:
        where = ".".join(str(x) for x in e["loc"]) or "body"
        parts.append(f"{where}: {e['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _id(found, name: str) -> str | None:
    value = found.get(name)
    if value is None:
        return None
    if not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise Rejected(f"{name}: 1 to {MAX_ID_CHARS} printable characters")
    return value


def _int(found, name: str, low: int) -> int | None:
    value = found.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise Rejected(f"{name}: {value[:40]!r} is not an integer") from None
    if number < low or number > 1 << 31:
        raise Rejected(f"{name}: {number} is out of range (at least {low})")
    return number


def _choice(found, name: str, enum, allowed=None):
    value = found.get(name)
    if value is None:
        return None
    options = list(allowed or enum)
    if value not in options:
        said = ", ".join(str(o) for o in options)
        raise Rejected(f"{name}: {value[:40]!r} is not one of {said}")
    return enum(value)
