"""The JSON API's views: the pages' paths (``chatstream.domain.sending``, the stream engine,
``chatstream.domain.access``) answered in JSON. docs/json-api.md is their reference.

Every object is looked up together with the caller: another user's conversation or generation
is a 404, indistinguishable from one that does not exist. As on the pages, every view but the
stream and Stop refuses (403) a user whom ``CHATSTREAM_ACCESS`` denies: a reply already
admitted streams to its end, and can be stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, cast
from uuid import UUID

from asgiref.sync import iscoroutinefunction
from django.core.handlers.wsgi import WSGIRequest
from django.core.paginator import InvalidPage, Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import aget_object_or_404, get_object_or_404
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt

from .. import stream, tools
from .._loops import in_executor
from ..domain import access, decisions, sending
from ..exceptions import RequestRefused
from ..models import Conversation, Generation, Message, ToolCall
from ..web import streaming, transcripts, windows
from ..web.feedback import RATINGS, STILL_LIVE, FeedbackForm, rate
from . import auth, encoding, inputs, ratelimit
from .errors import HEADERS, ApiError, as_api_error, not_found

CONVERSATIONS_PER_PAGE = 20
TITLE_LENGTH = 200  # Conversation.title's

# Never read: what was sent upstream is not the API's to show.
UNSENT = ("upstream_messages", "upstream_params")

View = Callable[..., Any]


def endpoint(*methods: str, chat: bool = True) -> Callable[[View], View]:
    """An API view answering ``methods``: its caller authenticated (see auth.py) and passed as
    ``user``, and (``chat``) allowed to chat; every refusal and error answered in JSON; every
    answer to an authenticated caller with their quota left (see ratelimit.py)."""

    def not_allowed(request: HttpRequest) -> HttpResponse:
        return ApiError(405, "method_not_allowed",
                        _("%(method)s is not allowed here.") % {"method": request.method},
                        headers={"Allow": ", ".join(methods)}).response()

    def decorate(view: View) -> View:
        if iscoroutinefunction(view):
            @wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                user = None
                try:
                    user = await auth.aauthenticate(request)
                    if request.method not in methods:
                        return await ratelimit.awith_headers(not_allowed(request), user)
                    if chat and not await in_executor(access.may_chat)(user):
                        raise await in_executor(access.refused)(user)
                    response = await cast(Callable[..., Awaitable[Any]], view)(
                        request, user, *args, **kwargs)
                except Exception as error:
                    response = as_api_error(error, request.path).response()
                return await ratelimit.awith_headers(response, user)

            return csrf_exempt(async_wrapper)

        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            user = None
            try:
                user = auth.authenticate(request)
                if request.method not in methods:
                    return ratelimit.with_headers(not_allowed(request), user)
                if chat and not access.may_chat(user):
                    raise access.refused(user)
                response = view(request, user, *args, **kwargs)
            except Exception as error:
                response = as_api_error(error, request.path).response()
            return ratelimit.with_headers(response, user)

        return csrf_exempt(wrapper)

    return decorate


def answer(data: dict[str, Any], status: int = 200, *, location: str | None = None) -> JsonResponse:
    headers = dict(HEADERS)
    if location is not None:
        headers["Location"] = location
    return JsonResponse(data, status=status, headers=headers)


# --- conversations --------------------------------------------------------------------------------

@endpoint("GET", "POST")
def conversations(request: HttpRequest, user: Any) -> JsonResponse:
    if request.method == "POST":
        return _create_conversation(request, user)
    found = Conversation.objects.filter(user=user).order_by("-updated_at", "-id")
    number = inputs.whole_number(request, "page")
    try:
        page = Paginator(found, CONVERSATIONS_PER_PAGE).page(1 if number is None else number)
    except InvalidPage:
        raise not_found() from None
    here = reverse("chatstream:api-conversations")
    return answer({
        "results": [encoding.conversation(c) for c in page.object_list],
        "next": f"{here}?page={page.next_page_number()}" if page.has_next() else None,
    })


def _create_conversation(request: HttpRequest, user: Any) -> JsonResponse:
    body = inputs.body(request)
    key, title = inputs.text(body, "model"), inputs.text(body, "title") or ""
    model = access.model_for(user, key or None)
    if model is None:
        raise ApiError(400, "invalid", _("This model is not available."))
    title = " ".join(title.split())
    if len(title) > TITLE_LENGTH:
        raise ApiError(400, "invalid", _("A title may be at most %(limit)d characters long.")
                       % {"limit": TITLE_LENGTH})
    conversation = Conversation.objects.create(user=user, model=model.key, title=title)
    data = encoding.conversation(conversation)
    return answer(data, 201, location=data["url"])


@endpoint("GET")
def conversation(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    """The conversation with a window of its messages, as its page shows them: the newest
    ``CHATSTREAM_CONVERSATION_PAGE_SIZE`` exchanges, or (``?before=<message id>``) those
    before one, with links to the pages before and after; each message with its newest
    replies and a link to the ones before (see :func:`message_generations`)."""
    found = get_object_or_404(Conversation, pk=pk, user=user)
    number = inputs.whole_number(request, "before")
    before = windows.page_anchor(found, None if number is None else str(number))
    exchanges, has_older = transcripts.transcript(found, before=before)
    encoding.with_attempts([g for e in exchanges for g in e["generations"]])
    here = reverse("chatstream:api-conversation", args=[found.pk])
    newer = None
    if before is not None:  # the page's link, to the API's own page
        page = windows.newer_page_url(found, before)
        newer = here + page if page.startswith("?") else here
    return answer({
        **encoding.conversation(found),
        "full": sending.is_full(found),
        "messages": [{**encoding.message(e["message"]),
                      "generations": [encoding.generation(g) for g in e["generations"]],
                      "older_generations": (
                          _replies_url(e["message"], e["generations"][0])
                          if e["earlier_replies"] else None)}
                     for e in exchanges],
        "older": f"{here}?before={exchanges[0]['message'].pk}" if has_older else None,
        "newer": newer,
    })


@endpoint("GET")
def message_generations(request: HttpRequest, user: Any, pk: int) -> JsonResponse:
    """The replies to one of the caller's messages, as a page shows them: the newest
    ``windows.REPLIES_PER_PAGE``, or (``?before=<generation id>``) those before one, oldest
    first, with links to the replies before and after."""
    message = get_object_or_404(Message, pk=pk, role=Message.Role.USER,
                                conversation__user=user)
    before_id = inputs.identifier(request, "before")
    before = windows.reply_anchor(message, None if before_id is None else str(before_id))
    window, earlier = windows.reply_window(list(windows.newest_replies(
        Generation.objects.defer(*UNSENT).filter(prompt_message=message), before=before)))
    encoding.with_attempts(window)
    return answer({
        "results": [encoding.generation(g) for g in window],
        "older": _replies_url(message, window[0]) if earlier else None,
        "newer": (_replies_url(message, windows.later_replies(message, before))
                  if before is not None else None),
    })


def _replies_url(message: Message, before: Generation | None) -> str:
    url = reverse("chatstream:api-message-generations", args=[message.pk])
    return url if before is None else f"{url}?before={before.pk}"


@endpoint("POST")
def messages(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    found = get_object_or_404(sending.counting_sent(Conversation.objects.all()), pk=pk, user=user)
    body = inputs.body(request)
    content, model = inputs.text(body, "content", required=True), inputs.text(body, "model")
    try:
        generation = sending.send(user, cast(str, content), conversation=found,
                                  model=model or None, request=request)
    except RequestRefused as refusal:  # kept: the failed generation says why (its notice)
        generation = cast(Generation, refusal.generation)
    data = encoding.generation(encoding.with_attempts([generation])[0])
    return answer({"message": encoding.message(generation.prompt_message), "generation": data,
                   "stream_url": data["stream_url"]}, 201, location=data["url"])


# --- generations ----------------------------------------------------------------------------------

@endpoint("GET")
def generation(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    return answer(encoding.generation(get_object_or_404(
        Generation.objects.defer(*UNSENT).prefetch_related(encoding.attempts_prefetch()),
        pk=pk, user=user)))


@endpoint("POST")
def retry(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    original = get_object_or_404(
        Generation.objects.defer(*UNSENT).select_related("conversation", "prompt_message",
                                                         "user"),
        pk=pk, user=user)
    inputs.body(request)  # none needed, but one sent must be a JSON object
    try:
        created = sending.retry(original, request=request)
    except RequestRefused as refusal:
        created = cast(Generation, refusal.generation)
    data = encoding.generation(encoding.with_attempts([created])[0])
    return answer(data, 201, location=data["url"])


@endpoint("POST", chat=False)
async def stop(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    """Stop a live reply wherever it streams (202: its stream ends with ``done``, cancelled,
    its text so far kept); nothing to do for a finished one."""
    found = await aget_object_or_404(Generation.objects.defer(*UNSENT), pk=pk, user=user)
    inputs.body(request)  # none needed, but one sent must be a JSON object
    # A reply written in steps stops at its step under way (its tools', or its stream).
    found = await in_executor(sending.last_step)(found)
    if found.is_live:
        await stream.arequest_stop(found.pk)
    await in_executor(encoding.with_attempts)([found])
    return answer(encoding.generation(found), 202)


@endpoint("GET")
def tool_calls(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    """The tool calls a reply's step asked for, in order, each as its stream's ``tool`` event
    gives it."""
    step = get_object_or_404(Generation.objects.only("pk"), pk=pk, user=user)
    return answer({"tool_calls": [tools.as_dict(call) for call in step.calls.all()]})


@endpoint("POST")
async def toolcall_approve(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    return await _decide(request, user, pk, approve=True)


@endpoint("POST")
async def toolcall_deny(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    return await _decide(request, user, pk, approve=False)


async def _decide(request: HttpRequest, user: Any, pk: UUID, *, approve: bool) -> JsonResponse:
    """Decide the user's call waiting for approval: the call as decided, and ``next``: the
    step that carries the reply on (pending, with its ``stream_url``) once this was its step's
    last decision, else null. 409 ``already_decided`` for a call no longer waiting."""
    inputs.body(request)  # none needed, but one sent must be a JSON object
    try:
        call, following = await in_executor(decisions.decide)(pk, user, approve=approve)
    except ToolCall.DoesNotExist:
        raise not_found() from None
    if following is not None and not await stream.aresume(call.generation, following):
        following = None
    if following is not None:
        following = await Generation.objects.defer(*UNSENT).prefetch_related(
            encoding.attempts_prefetch()).aget(pk=following.pk)
    return answer({"tool_call": tools.as_dict(call),
                   "next": encoding.generation(following) if following is not None else None})


@endpoint("GET", chat=False)
async def generation_stream(request: HttpRequest, user: Any, pk: UUID
                            ) -> HttpResponse | StreamingHttpResponse:
    """The reply's server-sent events, as the page's stream (``chatstream.web.views``) with a
    :class:`~chatstream.stream.JsonWire`: resumed from ``Last-Event-ID`` or ``?after=``."""
    after = streaming.resume_point(request)
    if after is None:
        raise ApiError(400, "invalid", str(streaming.BAD_RESUME_POINT))
    wire = stream.JsonWire(encoding.generation_text)
    stream.maybe_sweep_soon()
    if isinstance(request, WSGIRequest):
        refusal = await streaming.buffered_refusal(pk, user.pk, wire)
        if refusal is None:
            raise ApiError(501, "streaming_unavailable", str(streaming.NEEDS_ASGI))
        return refusal
    try:
        body, _released = await asyncio.gather(stream.aopen(pk, user.pk, wire, after=after),
                                                stream.release_request_connections())
    except stream.TooManyFollowers:
        raise ApiError(429, "too_many_streams", str(streaming.TOO_MANY_PAGES),
                       headers={"Retry-After": "5"}) from None
    if body is None:
        raise not_found()
    return await streaming.stream_response(body, wsgi=False)


@endpoint("GET", "POST")
def feedback(request: HttpRequest, user: Any, pk: UUID) -> JsonResponse:
    """The caller's rating of a reply of theirs; POST ``{"rating": "good" | "bad" | null,
    "comment"?}`` sets it once the reply has ended (see chatstream.web.feedback): null takes it
    back, with its comment; without ``comment`` the comment stays as it is."""
    found = get_object_or_404(Generation.objects.only("pk", "status", "user"), pk=pk,
                              user=user)
    if request.method == "GET":
        return answer(encoding.feedback(found.pk, found.feedback.filter(user=user).first()))
    if found.is_live:
        raise ApiError(409, "still_live", str(STILL_LIVE))
    body = inputs.body(request)
    rating, comment = body.get("rating", ...), inputs.text(body, "comment")
    if rating is not None and not (isinstance(rating, str) and rating in RATINGS):
        raise ApiError(400, "invalid", _('rating must be "good", "bad" or null.'))
    form = FeedbackForm({"rating": rating or "", "comment": comment or ""})
    if not form.is_valid():
        raise ApiError(400, "invalid", " ".join(str(m) for e in form.errors.values() for m in e))
    saved = rate(found, rating=RATINGS.get(rating or ""),
                         comment=None if comment is None else form.cleaned_data["comment"])
    return answer(encoding.feedback(found.pk, saved))


@csrf_exempt
def unknown(request: HttpRequest) -> JsonResponse:
    """Any other address under the API: a JSON 404, not the site's page."""
    return not_found().response()
