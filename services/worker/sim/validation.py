"""Turn an :class:`EngineRequest` into a :class:`SimSequence`, or refuse it precisely.

Everything here happens before the request is queued, so a request that can never succeed is
refused before anything is streamed, with an error that names the parameter at fault:

    model not served                          ModelNotFound          param "model"
    no messages, bad role                     InvalidRequest         param "messages"
    temperature not in [0, 2]                 InvalidRequest         param "temperature"
    top_p not in (0, 1]                       InvalidRequest         param "top_p"
    max_tokens < 1                            InvalidRequest         param "max_tokens"
    presence/frequency penalty not in [-2, 2] InvalidRequest         param of the same name
    top_logprobs not in [0, 20], or set
      without logprobs                        InvalidRequest         param "top_logprobs"
    empty stop string                         InvalidRequest         param "stop"
    prompt fills the context                  ContextLengthExceeded  param "messages"
    prompt + max_tokens over the context      ContextLengthExceeded  param "max_tokens"

(``ContextLengthExceeded`` is an ``InvalidRequest`` with code ``context_length_exceeded``, as
OpenAI and vLLM report both context cases.)

Seeds: with ``temperature == 0`` the output depends only on the prompt (greedy decoding is
deterministic); with a ``seed`` it depends on the seed and the prompt (OpenAI's promise: same
seed, same prompt, same output); otherwise it is derived from the request id.
"""

from __future__ import annotations

import random

from services.common.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from services.worker.engine import (
    ChatTurn,
    EngineRequest,
    RawPrompt,
    ResumeInput,
    SamplingOptions,
    TokenLogprob,
    check_min_tokens,
)
from services.worker.sim.config import SimConfig
from services.worker.sim.script import build_script, needs_script
from services.worker.sim.sequence import SimSequence
from services.worker.sim.text import (
    TextGenerator,
    render_chat,
    seed_for,
    split_pieces,
    tokenize,
)
from services.worker.truncation import fit_oldest, max_prompt_tokens

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_TOP_LOGPROBS = 20


def check_sampling(sampling: SamplingOptions) -> None:
    """Range checks that do not depend on the prompt. NaN fails every range."""
    s = sampling
    if s.temperature is not None and not 0.0 <= s.temperature <= 2.0:
        raise InvalidRequest(
            f"temperature must be between 0 and 2, got {s.temperature}", param="temperature"
        )
    if s.top_p is not None and not 0.0 < s.top_p <= 1.0:
        raise InvalidRequest(f"top_p must be in (0, 1], got {s.top_p}", param="top_p")
    if s.max_tokens is not None and s.max_tokens < 1:
        raise InvalidRequest(
            f"max_tokens must be at least 1, got {s.max_tokens}", param="max_tokens"
        )
    for name, value in (
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ):
        if value is not None and not -2.0 <= value <= 2.0:
            raise InvalidRequest(f"{name} must be between -2 and 2, got {value}", param=name)
    if not 0 <= s.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {s.top_logprobs}",
            param="top_logprobs",
        )
    if s.top_logprobs and not s.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    if any(not stop for stop in s.stop):
        raise InvalidRequest("stop strings must not be empty", param="stop")


def raw_prompt(prompt: RawPrompt) -> tuple[str, list[int]]:
    """A completions prompt's text and token ids. Token ids have no vocabulary here: each
    shows as `` <id>`` where text is needed (echo), so the text is still deterministic."""
    if prompt.text is not None:
        return prompt.text, tokenize(prompt.text)
    return "".join(id_piece(t) for t in prompt.token_ids), list(prompt.token_ids)


def id_piece(token_id: int) -> str:
    return f" <{token_id}>"


def echo_logprobs(prompt: RawPrompt, top: int) -> tuple[TokenLogprob, ...]:
    """Deterministic log-probabilities of the prompt's own tokens (echo with logprobs). The
    first token has none (nothing precedes it): logprob 0 and no alternatives, which the edge
    shows as ``null`` as OpenAI does."""
    if prompt.text is not None:
        pieces = split_pieces(prompt.text)
    else:
        pieces = [id_piece(t) for t in prompt.token_ids]
    gen = TextGenerator(seed_for("prompt", *pieces[:64], len(pieces)))
    out = [TokenLogprob(token=pieces[0], logprob=0.0)] if pieces else []
    for piece in pieces[1:]:
        value, alts = gen.logprobs(piece, top)
        out.append(TokenLogprob(token=piece, logprob=value, top=alts))
    return tuple(out)


def build_sequence(
    request: EngineRequest, config: SimConfig, *, arrival: float, order: int
) -> SimSequence:
    """Validate ``request`` against ``config`` and build its sequence (WAITING, no KV)."""
    if not request.request_id:
        raise InvalidRequest("request_id must not be empty", param="request_id")
    if request.model not in config.models:
        raise ModelNotFound(
            f"model {request.model!r} is not served here (served: {', '.join(config.models)})",
            param="model",
        )
    sampling = request.sampling
    if request.prompt is not None:
        if not config.completions:
            raise InvalidRequest("this model does not serve completions", param="prompt")
        check_sampling(sampling)
        prompt_text, prompt_ids = raw_prompt(request.prompt)
        where, dropped = "prompt", 0
    else:
        if not request.messages:
            raise InvalidRequest("messages must contain at least one message", param="messages")
        for i, turn in enumerate(request.messages):
            if turn.role not in ROLES:
                raise InvalidRequest(
                    f"messages[{i}].role {turn.role!r} is not one of {', '.join(sorted(ROLES))}",
                    param="messages",
                )
        check_sampling(sampling)
        prompt_text, prompt_ids, dropped = _chat_prompt(request, config.max_model_len)
        where = "messages"
    limit = config.max_model_len
    if not prompt_ids:
        raise InvalidRequest("the prompt must not be empty", param=where)
    if len(prompt_ids) >= limit:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {limit} tokens; the {where} take "
            f"{len(prompt_ids)} tokens, leaving no room for a completion",
            param=where,
        )
    room = limit - len(prompt_ids)
    if sampling.max_tokens is not None and sampling.max_tokens > room:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {limit} tokens; you requested "
            f"{len(prompt_ids) + sampling.max_tokens} tokens ({len(prompt_ids)} in the {where}, "
            f"{sampling.max_tokens} in the completion)",
            param="max_tokens",
        )

    if sampling.temperature == 0.0:
        seed = seed_for("greedy", prompt_text)
    elif sampling.seed is not None:
        seed = seed_for("seed", sampling.seed, prompt_text)
    else:
        seed = seed_for("request", request.seed_id)
    max_tokens = sampling.max_tokens if sampling.max_tokens is not None else room
    check_min_tokens(sampling.min_tokens, max_tokens)
    # The script is built here, on the event loop, before anything is queued: its work is
    # bounded by the request's token budget, whatever the schema asks for.
    script = build_script(request, seed, max_tokens=max_tokens) if needs_script(request) else None
    natural_len = None
    if script is not None:
        natural_len = len(script)
    elif not sampling.ignore_eos:
        natural_len = random.Random(seed_for("length", seed)).randint(
            config.output_len_min, config.output_len_max
        )
    seq = SimSequence(
        request_id=request.request_id,
        priority=request.priority,
        arrival=arrival,
        order=order,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        natural_len=natural_len,
        stop=sampling.stop,
        max_model_len=limit,
        generator=TextGenerator(seed),
        logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs,
        script=script,
        min_tokens=sampling.min_tokens or 0,
        stop_token_ids=frozenset(sampling.stop_token_ids),
        dropped_messages=dropped,
    )
    if request.resume is not None:
        resume_sequence(seq, request.resume)
    return seq


def _chat_prompt(request: EngineRequest, limit: int) -> tuple[str, list[int], int]:
    """The chat prompt's text and token ids, and how many of the oldest messages were left
    out of it: with ``truncate_oldest``, as few as make it fit beside ``max_tokens``
    (services/worker/truncation.py); otherwise none (the caller refuses a prompt too long)."""

    def measure(messages: tuple[ChatTurn, ...]) -> tuple[str, list[int]]:
        text = render_chat(messages, tools=request.tools)
        return text, tokenize(text)

    if not request.truncate_oldest:
        text, ids = measure(request.messages)
        return text, ids, 0
    longest = max_prompt_tokens(limit, request.sampling.max_tokens)
    fitted = fit_oldest(request.messages, measure, lambda m: len(m[1]) <= longest)
    text, ids = fitted.measured
    return text, ids, fitted.dropped


def resume_sequence(seq: SimSequence, resume: ResumeInput) -> None:
    """Put ``seq`` where the migrated stream left off: the delivered tokens replayed through
    the very path that generated them (:meth:`SimSequence.replay_token`: the generator or
    script, the logprob stream, the text and the finish rules; text is a function of seed and
    position, so the continuation is byte-identical to an uninterrupted stream), so they
    count as generated (usage, ``max_tokens``, ``min_tokens``), and the text the client has
    not seen yet (held back for a possible stop string) is queued to be sent first.

    Refused: tokens that are not this seed's sequence (they would make the continuation
    silently wrong), and tokens past which the uninterrupted stream would not have gone on
    (it had ended: natural end, stop string or token, a length limit — judged by the same
    rules as generation, so a stream that ``min_tokens`` keeps going past its natural end
    moves like any other)."""
    for i, tid in enumerate(resume.delivered_token_ids):
        if seq.finish_reason is not None:
            break
        if seq.replay_token() != tid:
            raise InvalidRequest(
                f"resume.delivered_token_ids[{i}] does not continue this request's output",
                param="resume.delivered_token_ids",
            )
    if seq.finish_reason is not None:
        raise InvalidRequest(
            "resume.delivered_token_ids already reach this request's end",
            param="resume.delivered_token_ids",
        )
    sent = resume.delivered_text_chars
    if sent > len(seq.text) or not seq.text[:sent].endswith(resume.delivered_text_tail):
        raise InvalidRequest(
            "resume.delivered_text_tail is not the delivered tokens' text",
            param="resume.delivered_text_tail",
        )
    seq.emitted = sent
