"""The gateway's Meter (app.gateway.server): the tokens of an answer in every shape llama-server sends them. The bodies
are what this project's llama-server build (scripts/build_llama_server.sh) answered, the second time for the same
prompt (56 of its 57 prompt tokens cached): usage and timings, streamed and not, for /v1/chat/completions,
/v1/completions, /v1/responses, /v1/messages and /v1/embeddings. tests/llama/test_gateway.py checks the same numbers
end to end, from the real server to the service's gateway_usage rows."""

from __future__ import annotations

import json

import pytest

from app.gateway.server import Meter

TIMINGS = {"cache_n": 56, "prompt_n": 1, "prompt_ms": 4.0, "predicted_n": 2, "predicted_ms": 0.4}
USAGE = {"completion_tokens": 2, "prompt_tokens": 57, "total_tokens": 59, "prompt_tokens_details": {"cached_tokens": 56}}


def sse(*docs: dict | str, events: tuple[str, ...] = ()) -> bytes:
    """An event stream as llama-server writes it: `event:` lines where given, `data: ` and a blank line."""
    out = b""
    for n, doc in enumerate(docs):
        if events:
            out += f"event: {events[n]}\n".encode()
        out += b"data: " + (doc if isinstance(doc, str) else json.dumps(doc)).encode() + b"\n\n"
    return out


def chunk(content: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": content}}], "object": "chat.completion.chunk"}


CHAT = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Q.h"}}], "object": "chat.completion",
        "usage": {**USAGE, "completion_tokens": 3, "total_tokens": 60},
        "timings": {**TIMINGS, "predicted_n": 3}}
CHAT_STREAM = sse(chunk("a"), chunk("b"), {"choices": [], "usage": USAGE, "timings": TIMINGS}, "[DONE]")
# Without stream_options.include_usage: the last chunk carries only the timings (prompt_n counts the uncached part).
CHAT_STREAM_TIMINGS = sse(chunk("a"), {**chunk("b"), "timings": TIMINGS}, "[DONE]")
COMPLETION = {"choices": [{"text": "x", "index": 0}], "object": "text_completion",
              "usage": {"completion_tokens": 3, "prompt_tokens": 7, "total_tokens": 10,
                        "prompt_tokens_details": {"cached_tokens": 2}},
              "timings": {**TIMINGS, "cache_n": 2, "prompt_n": 5, "predicted_n": 3}}
RESPONSE = {"object": "response", "status": "completed", "output": [],
            "usage": {"input_tokens": 57, "output_tokens": 3, "total_tokens": 60,
                      "input_tokens_details": {"cached_tokens": 56}}}
RESPONSE_STREAM = sse(
    {"type": "response.created", "response": {"id": "resp_1", "object": "response", "status": "in_progress"}},
    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "O"},
    {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": [], "usage": {
        "input_tokens": 57, "output_tokens": 2, "total_tokens": 59, "input_tokens_details": {"cached_tokens": 56}}},
     "timings": TIMINGS},
    events=("response.created", "response.output_text.delta", "response.completed"))  # no [DONE] in this API
# Anthropic's input_tokens leaves out what was read from the cache (cache_read_input_tokens).
MESSAGE = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "x"}],
           "stop_reason": "max_tokens", "usage": {"cache_read_input_tokens": 56, "input_tokens": 1, "output_tokens": 3}}
MESSAGE_STREAM = sse(
    {"type": "message_start", "message": {"type": "message", "role": "assistant", "content": [], "usage": {
        "cache_read_input_tokens": 56, "input_tokens": 1, "output_tokens": 0}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
    events=("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
            "message_stop"))
EMBEDDING = {"model": "tiny", "object": "list", "usage": {"prompt_tokens": 7, "total_tokens": 7},
             "data": [{"embedding": [0.08, -0.14], "index": 0, "object": "embedding"}]}
COUNTED = {"input_tokens": 57, "object": "response.input_tokens"}  # /v1/responses/input_tokens: nothing generated


def metered(body: bytes, streamed: bool, pieces: list[bytes] | None = None) -> Meter:
    meter = Meter(streamed=streamed)
    for piece in pieces if pieces is not None else [body]:
        meter.feed(piece)
    meter.finish()
    return meter


@pytest.mark.parametrize(("body", "streamed", "tokens"), [
    (CHAT, False, (57, 3)), (CHAT_STREAM, True, (57, 2)), (CHAT_STREAM_TIMINGS, True, (57, 2)),
    (COMPLETION, False, (7, 3)), (RESPONSE, False, (57, 3)), (RESPONSE_STREAM, True, (57, 2)),
    (MESSAGE, False, (57, 3)), (MESSAGE_STREAM, True, (57, 2)), (EMBEDDING, False, (7, 0)), (COUNTED, False, (0, 0)),
], ids=["chat", "chat-stream", "chat-stream-timings", "completion", "responses", "responses-stream", "messages",
        "messages-stream", "embeddings", "input-tokens"])
def test_every_shape_llama_server_answers_is_counted_cached_tokens_included(body, streamed, tokens):
    """Nearest wrong versions:
    - timings' prompt_n alone (the cached cache_n left out): 1 prompt token, not 57
    - only OpenAI's prompt_tokens/completion_tokens read: /v1/responses and /v1/messages counted 0
    - Anthropic's input_tokens alone (cache_read_input_tokens left out): 1, not 57
    - message_delta's usage (output only) taken as a whole: the prompt from message_start reset to 0
    - message_start's usage (output 0) read last, or message_delta's skipped: 0 output tokens
    - an embedding's usage (no completion_tokens) skipped: its 7 prompt tokens lost
    - a count of input tokens (nothing generated) billed as a prompt"""
    meter = metered(body if isinstance(body, bytes) else json.dumps(body).encode(), streamed)
    assert (meter.prompt, meter.completion) == tokens


@pytest.mark.parametrize("body", [CHAT_STREAM, CHAT_STREAM_TIMINGS, RESPONSE_STREAM, MESSAGE_STREAM],
                         ids=["chat", "chat-timings", "responses", "messages"])
def test_data_with_no_space_after_the_colon_is_data(body):
    """SSE's `data:{...}` is the same field as `data: {...}`.
    Nearest wrong versions:
    - only `data: {` matched: nothing counted
    - `data:` matched but its first byte always cut: `{` lost, the JSON unreadable
    - `data:[DONE]` not seen as the end"""
    tight = body.replace(b"data: ", b"data:")
    meter = metered(tight, True)
    assert (meter.prompt, meter.completion) == (57, 2)
    assert meter.done is (b"[DONE]" in body)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("body", [CHAT_STREAM, RESPONSE_STREAM, MESSAGE_STREAM], ids=["chat", "responses", "messages"])
def test_a_stream_split_at_any_byte_counts_the_same(body, line_end):
    """Chunks end anywhere: inside a line, inside `data:`, between CR and LF.
    Nearest wrong versions:
    - each chunk parsed alone (no buffer kept across chunks): a split usage line lost
    - the buffer's rest dropped after each chunk, or a line's CR taken as part of [DONE]"""
    body = body.replace(b"\n", line_end)
    for at in range(1, len(body)):
        meter = metered(body, True, [body[:at], body[at:]])
        assert (meter.prompt, meter.completion) == (57, 2), at
        assert meter.done is (b"[DONE]" in body), at
    one_by_one = metered(body, True, [body[i:i + 1] for i in range(len(body))])
    assert (one_by_one.prompt, one_by_one.completion) == (57, 2)


@pytest.mark.parametrize("space", [b" ", b""], ids=["space", "no-space"])
def test_the_usage_in_the_last_chunk_with_done_and_a_last_line_without_its_newline(space):
    """The usage and [DONE] arrive in one last chunk; a stream cut after its usage line but before the newline still
    counts it (finish reads the rest).
    Nearest wrong versions:
    - finish ignores what is left in the buffer: the unterminated usage line lost
    - finish matches only `data: {`: the rest of a `data:{` stream lost"""
    last = b"data:" + space + json.dumps({"choices": [], "usage": USAGE}).encode()
    meter = metered(b"", True, [sse(chunk("a")), last + b"\n\ndata:" + space + b"[DONE]\n\n"])
    assert (meter.prompt, meter.completion, meter.done) == (57, 2, True)
    cut = metered(b"", True, [sse(chunk("a")), last])
    assert (cut.prompt, cut.completion, cut.done) == (57, 2, False)


def test_only_data_lines_count():
    """A comment or another field that names "usage" is not data; `data: [DONE]` with more after it is not the end.
    Nearest wrong versions:
    - `"usage"` looked for in any line (a comment's JSON counted)
    - [DONE] matched as a prefix"""
    usage = json.dumps({"usage": {"prompt_tokens": 99, "completion_tokens": 99}}).encode()
    meter = metered(b"", True, [b": " + usage + b"\n", b"id: " + usage + b"\n", b"data: [DONE]x\n\n"])
    assert (meter.prompt, meter.completion, meter.done) == (0, 0, False)


def test_a_whole_answer_is_parsed_up_to_meter_limit_and_one_byte_more_is_counted_as_unknown():
    """A non-streamed answer is kept for its usage up to METER_LIMIT bytes; past it the buffer is dropped and the
    answer counted as unknown (streamed None), never parsed. Wrong versions: the limit moved by a byte; the buffer
    kept (memory) or parsed anyway."""
    from app.gateway.server import METER_LIMIT

    for extra, counted in ((0, (57, 3)), (1, (0, 0))):
        body = json.dumps({**CHAT, "pad": ""}).encode()
        body = body[:-2] + b"x" * (METER_LIMIT - len(body) + extra) + b'"}'
        assert len(body) == METER_LIMIT + extra
        meter = metered(body, False, [body[:1000], body[1000:]])
        assert (meter.prompt, meter.completion) == counted
        assert meter.streamed is (False if extra == 0 else None) and meter.size == len(body)


def test_a_whole_answer_is_done_at_its_content_length_and_not_a_byte_before():
    """Wrong versions: done a byte early (a client that left then is billed as served); never done."""
    body = json.dumps(CHAT).encode()
    meter = Meter(streamed=False, expected=len(body))
    meter.feed(body[:-1])
    assert not meter.done
    meter.feed(body[-1:])
    assert meter.done


def test_a_line_longer_than_line_limit_is_overlong_and_one_of_exactly_the_limit_is_not():
    """Wrong versions: the limit moved by a byte; an overlong line kept whole (memory)."""
    from app.gateway.server import LINE_LIMIT

    meter = Meter(streamed=True)
    meter.feed(b"data: " + b"x" * (LINE_LIMIT - 6))
    assert not meter.overlong and len(meter._buffer) == LINE_LIMIT
    meter.feed(b"x")
    assert meter.overlong and len(meter._buffer) == 0


@pytest.mark.parametrize(("doc", "tokens"), [
    ({"usage": {"input_tokens": 1, "cache_read_input_tokens": 2, "cache_creation_input_tokens": 4, "output_tokens": 8}},
     (7, 8)),
    ({"usage": {"prompt_tokens": None, "completion_tokens": 3}}, (0, 3)),
    ({"timings": {"prompt_n": None, "cache_n": None, "predicted_n": 3}}, (0, 3)),
    ({"usage": {"output_tokens": 5}}, (0, 5)),
    ([{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}], (0, 0)),
    ({"usage": "x", "timings": "y"}, (0, 0)),
], ids=["anthropic-cache-written", "null-prompt", "null-timings", "output-only", "not-an-object", "not-tables"])
def test_what_each_usage_field_adds_and_what_is_not_a_usage(doc, tokens):
    """Anthropic's prompt is input, cache read and cache written; a null count is 0; a document that is not an object,
    or a usage that is not a table, counts nothing. Wrong versions: a cache count left out; a null count failing."""
    meter = metered(json.dumps(doc).encode(), False)
    assert (meter.prompt, meter.completion) == tokens


def test_a_responses_stream_whose_completed_event_carries_only_its_usage_is_counted():
    """The Responses API's response.completed holds the usage inside "response" (llama-server adds timings beside it;
    another server may not). Wrong version: "response" not looked into: 0 tokens."""
    body = sse({"type": "response.completed", "response": {"status": "completed", "usage": {
        "input_tokens": 5, "output_tokens": 6, "total_tokens": 11}}}, events=("response.completed",))
    meter = metered(body, True)
    assert (meter.prompt, meter.completion) == (5, 6)
