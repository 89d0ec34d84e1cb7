"""SSE framing and chunk decoding, on real bytes from a llama.cpp server."""


import msgspec
import pytest
from support import FIXTURES

from loadgen.worker.sse import DONE, SseParser, chunk_decoder

CAPTURES = FIXTURES / "captures" / "llamacpp"


def _payloads(raw: bytes, step: int) -> list[bytes]:
    parser = SseParser()
    out: list[bytes] = []
    for i in range(0, len(raw), step):
        out += parser.feed(raw[i : i + step])
    assert parser.pending == b""
    return out


@pytest.mark.parametrize("step", [1, 7, 64, 100_000])
def test_chat_capture_any_split(step):
    raw = (CAPTURES / "sse-chat.txt").read_bytes()
    payloads = _payloads(raw, step)
    assert payloads[-1] == DONE
    chunks = [chunk_decoder.decode(p) for p in payloads[:-1]]
    # the role-only first chunk (content null) carries no text; four content chunks do
    assert [c.has_text() for c in chunks] == [False, True, True, True, True, False, False]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == 17


def test_completions_capture_usage_on_finish_chunk():
    raw = (CAPTURES / "sse-completions.txt").read_bytes()
    payloads = _payloads(raw, 13)
    chunks = [chunk_decoder.decode(p) for p in payloads if p != DONE]
    assert [c.has_text() for c in chunks] == [True, True, True, False]
    assert chunks[-1].usage.completion_tokens == 3


def test_crlf_comments_and_multiline_data():
    parser = SseParser()
    got = parser.feed(b": keep-alive\r\n\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\ndata:[DONE]\r\n\r\n")
    assert got == [b'{"a":\n1}', DONE]


def test_not_sse_is_an_error():
    with pytest.raises(ValueError, match="not an SSE line"):
        SseParser().feed(b"<html>oops</html>\n\n")


def test_bad_json_is_a_decode_error():
    with pytest.raises(msgspec.DecodeError):
        chunk_decoder.decode(b'{"choices": [{"delta": {"content": "x"}')


def test_reasoning_counts_as_text():
    c = chunk_decoder.decode(b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}')
    assert c.has_text()
    assert not chunk_decoder.decode(b'{"choices":[{"delta":{"content":""}}]}').has_text()
