"""How much of a reply is read and kept: the bounds no provider can push a stream past.

- ``CHATSTREAM_MAX_REPLY_LENGTH`` characters of content (the run cuts the last delta there, so
  nothing beyond reaches the browser), and as many of all the reply holds (refusal, reasoning and
  tool calls included, and a fixed charge per tool call and per choice beyond the first, so that
  empty ones count too: the accumulator's ``size``, see chatstream.completions), checked after
  every network read in constant time (:func:`past_bounds`);
- :data:`BYTES_PER_CHARACTER` times that in bytes read from the provider, once inflated
  (:func:`provider_bytes`); a gzip or deflate body, which we ask not to get, is inflated
  :data:`INFLATE_STEP` bytes at a time, so a gzip bomb never allocates more at once;
- far past the request's ``max_tokens`` (:func:`chatstream.domain.usage.characters_within`).

Past one, :class:`~chatstream.exceptions.ReplyTooLongError`: the run closes the upstream and
keeps the text so far.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator

import httpx

from ..completions import ChatCompletionAccumulator
from ..exceptions import ReplyTooLongError, UnsupportedEncodingError, error_code

# The provider's bytes are bounded at this many per character of CHATSTREAM_MAX_REPLY_LENGTH. One
# delta's framing (``data: {"id": ..., "object": "chat.completion.chunk", ...}``) is ~100-300
# bytes, and a delta may carry a single character (CJK text is ~1 token per character), so an
# honest reply within the character cap may take ~250 bytes per character: 256 lets it through.
# The bytes are work, not memory: none is kept (the decoder holds at most one unfinished event).
BYTES_PER_CHARACTER = 256

# A compressed reply is inflated at most this many bytes at a time.
INFLATE_STEP = 64 * 1024


async def provider_bytes(raw: AsyncIterator[bytes], encoding: str, *,
                          limit: int) -> AsyncIterator[bytes]:
    """The reply's bytes, inflated from gzip or deflate in steps of ``INFLATE_STEP`` (so a gzip
    bomb never allocates more at once); ReplyTooLongError past ``limit`` of them.

    A provider that compresses although asked not to (some proxies do; so does a site's own
    ``Accept-Encoding`` header) is still read. Other codings are refused.
    """
    coding = encoding.strip().lower()
    inflate = None
    if coding in ("gzip", "x-gzip", "deflate"):
        inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)  # a gzip or zlib header
    elif coding not in ("", "identity"):
        raise UnsupportedEncodingError(
            f"The provider answered in the content coding {error_code(coding) or 'it named'}, "
            "which chatstream does not read (only gzip and deflate).")
    read = 0
    async for chunk in raw:
        for piece in (chunk,) if inflate is None else _inflated(inflate, chunk):
            read += len(piece)
            if read > limit:
                raise ReplyTooLongError(
                    f"The provider sent over {limit} bytes for this reply "
                    f"({BYTES_PER_CHARACTER} per character of CHATSTREAM_MAX_REPLY_LENGTH); "
                    "it was cut there.")
            yield piece


def _inflated(inflate: zlib._Decompress, data: bytes) -> Iterator[bytes]:
    try:
        piece = inflate.decompress(data, INFLATE_STEP)
        while piece:
            yield piece
            piece = inflate.decompress(inflate.unconsumed_tail, INFLATE_STEP)
    except zlib.error as exc:  # as httpx said of a broken compressed body
        raise httpx.DecodingError(f"The provider's compressed reply is broken ({exc}).") from None


def past_bounds(reply: ChatCompletionAccumulator, cap: int, per_choice: int,
                max_tokens: int) -> ReplyTooLongError | None:
    """Whether what the reply holds (its ``size``: every choice's text, reasoning and tool calls,
    and what its choices and tool calls count) passed the reply's cap, or one choice ran far
    past ``max_tokens``. Constant time: the accumulator keeps both figures as chunks arrive."""
    if reply.size > cap:
        return ReplyTooLongError(
            f"The reply passed {cap} characters (CHATSTREAM_MAX_REPLY_LENGTH), counting its "
            "reasoning, tool calls and choices, and was cut there.")
    if reply.largest > per_choice:
        return ReplyTooLongError(
            f"The reply ran far past max_tokens={max_tokens} (over {per_choice} characters) "
            "and was cut there.", kind="max_tokens_exceeded")
    return None
