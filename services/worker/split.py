"""An engine output too large for one gRPC message, as several outputs that say the same.

What makes an output large is its logprobs: an echoed prompt's (one entry per prompt token,
each with up to 20 alternatives: an 8k-token prompt is ~5 MB) and the merged output of a
stream whose reader fell behind (the engine merges what waits, thousands of tokens with their
logprobs). One chunk over the 4 MiB message limit failed its call, and on a GenerateMux call
every other stream on it too. So an output with more than ``max_entries`` logprob entries
goes out as pieces of at most that many:

- first the prompt's: the first piece has ``prompt_text`` and the queue and prefill timings,
  each piece the next run of ``prompt_logprobs``;
- then the output's tokens, a run of logprobs per piece; when the tokens spell the text (the
  usual case), each piece has its tokens' text and ids, and its cumulative ``completion_tokens``
  counts what has been sent so far; when they do not (a detokenizer that joined bytes
  across tokens), the whole text and every id go in the first output piece, the logprobs
  follow in order;
- the last piece has what ends the output: the finish reason, the decode time, tool calls and
  the hand-off flag.

Joined by a reader in order, the pieces give back the output's text, ids, logprobs, prompt
and usage; the edge renders them as consecutive chunks.
"""

from __future__ import annotations

import dataclasses

from services.worker.engine import EngineOutput

#: Logprob entries in one chunk at most: ~100-250 KB with 20 alternatives each.
MAX_LOGPROB_ENTRIES = 256


def too_large(out: EngineOutput, max_entries: int = MAX_LOGPROB_ENTRIES) -> bool:
    return len(out.logprobs) + len(out.prompt_logprobs) > max_entries


def split_output(out: EngineOutput, max_entries: int = MAX_LOGPROB_ENTRIES) -> list[EngineOutput]:
    """``out`` as pieces of at most ``max_entries`` logprob entries each (``[out]`` itself
    when it has no more than that)."""
    if max_entries < 1:
        raise ValueError("max_entries must be >= 1")
    if not too_large(out, max_entries):
        return [out]
    base = dataclasses.replace(
        out,
        text="",
        token_ids=(),
        finish_reason=None,
        completion_tokens=out.completion_tokens - len(out.token_ids),
        queue_ms=None,
        prefill_ms=None,
        decode_ms=None,
        logprobs=(),
        tool_calls=(),
        handoff=False,
        prompt_text="",
        prompt_logprobs=(),
    )
    pieces: list[EngineOutput] = []
    prompt = out.prompt_logprobs
    for start in range(0, len(prompt), max_entries):
        pieces.append(
            dataclasses.replace(base, prompt_logprobs=prompt[start : start + max_entries])
        )
    lps, ids = out.logprobs, out.token_ids
    aligned = len(ids) == len(lps) and "".join(lp.token for lp in lps) == out.text
    sent = 0  # of the output's tokens, in pieces so far
    for start in range(0, len(lps), max_entries):
        run = lps[start : start + max_entries]
        if aligned:
            piece_ids = ids[start : start + max_entries]
            text = "".join(lp.token for lp in run)
        elif start == 0:
            piece_ids, text = ids, out.text
        else:
            piece_ids, text = (), ""
        sent += len(piece_ids)
        pieces.append(
            dataclasses.replace(
                base,
                text=text,
                token_ids=piece_ids,
                logprobs=run,
                completion_tokens=base.completion_tokens + sent,
            )
        )
    if not lps and (out.text or out.token_ids):  # only the prompt's were many
        pieces.append(
            dataclasses.replace(
                base, text=out.text, token_ids=ids, completion_tokens=out.completion_tokens
            )
        )
    first, last = pieces[0], pieces[-1]
    first.prompt_text = out.prompt_text
    first.queue_ms, first.prefill_ms = out.queue_ms, out.prefill_ms
    last.finish_reason, last.decode_ms = out.finish_reason, out.decode_ms
    last.tool_calls, last.handoff = out.tool_calls, out.handoff
    last.completion_tokens = out.completion_tokens
    return pieces
