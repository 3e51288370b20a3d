"""Thin views: parse the request, check access, hand over to the stream engine, render.

Every object is looked up together with ``user=request.user``: another user's conversation or
generation is a 404, indistinguishable from one that does not exist.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
from typing import Any, cast
from uuid import UUID

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.handlers.wsgi import WSGIRequest
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import aget_object_or_404, get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.middleware import HtmxDetails

from .. import quota, stream
from .._loops import in_executor
from ..domain import access, sending, versions
from ..domain.access import chat_access_required
from ..exceptions import (
    ConversationFull,
    InvalidMessage,
    NotEditable,
    QuotaExceeded,
    Refusal,
    ReplyStillLive,
    RequestRefused,
    TooManyReplies,
)
from ..models import Conversation, Generation, Message
from . import rendered, rendering, search_results, windows
from .feedback import (
    RATINGS,
    STILL_LIVE,
    FeedbackForm,
    FeedbackState,
    rate,
    state_of,
    with_feedback,
)
from .feedback import (
    TEMPLATE as FEEDBACK_TEMPLATE,
)
from .forms import ConversationForm, EditForm, MessageForm, SearchForm
from .streaming import (
    BAD_RESUME_POINT,
    NEEDS_ASGI,
    TOO_MANY_PAGES,
    buffered_refusal,
    resume_point,
    stream_response,
)
from .transcripts import exchange, transcript
from .wire import PageWire

MODEL_NOT_AVAILABLE = gettext_lazy(
    "This model is not available to you: choose another one in the list.")


class HtmxHttpRequest(HttpRequest):
    """A request seen by django-htmx's ``HtmxMiddleware`` (a required setting): ``htmx`` is
    truthy when htmx sent it."""

    htmx: HtmxDetails


@login_required
@chat_access_required
@require_GET
def conversation_list(request: HttpRequest) -> HttpResponse:
    return render(request, "chatstream/conversation_list.html", {
        **_listed(request), "search_form": SearchForm()})


def _listed(request: HttpRequest) -> dict[str, Any]:
    """The page of the user's conversations ``?page=`` asks for, newest first."""
    conversations = Conversation.objects.filter(
        user=request.user,  # type: ignore[misc]  # login_required: never AnonymousUser
    ).order_by("-updated_at")
    page = Paginator(conversations, 20).get_page(request.GET.get("page"))
    return {"page": page, "conversations": page.object_list,
            "models": access.models_for(request.user)}


@login_required
@chat_access_required
@require_GET
def conversation_search(request: HtmxHttpRequest) -> HttpResponse:
    """The user's conversations matching ``?q=``, best first (the normal list for an empty
    query): the list page, or its results region alone for htmx."""
    form = SearchForm(request.GET)
    context: dict[str, Any] = {"search_form": form, "searched": True}
    status = 200
    if not form.is_valid():
        status = 400
    elif query := form.cleaned_data["q"]:
        context["results"], context["more_results"] = search_results.results(request.user, query)
        context["query"] = query
    else:
        context.update(_listed(request), searched=False)
    template = ("chatstream/includes/conversation_results.html" if request.htmx
                else "chatstream/conversation_list.html")
    response = render(request, template, context, status=status)
    # One address, two answers (htmx's region, the whole page): Back must not get the region.
    patch_vary_headers(response, ["HX-Request"])
    return response


@login_required
@chat_access_required
@require_POST
def conversation_create(request: HttpRequest) -> HttpResponse:
    model = access.model_for(request.user, request.POST.get("model") or None)
    if model is None:
        return HttpResponse(_("This model is not available."), status=400)
    conversation = Conversation.objects.create(
        user=request.user,  # type: ignore[misc]  # login_required: never AnonymousUser
        model=model.key,
    )
    return redirect(conversation)


def _keep_rendered(exchanges: list[dict[str, Any]]) -> None:
    """The replies a page shows, rendered again where what they were rendered with has
    changed (see chatstream/web/rendered.py), and kept: one query for the page."""
    rendered.keep(g for shown in exchanges for g in shown["generations"])


@login_required
@chat_access_required
@require_GET
def conversation_detail(request: HttpRequest, pk: UUID) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=pk, user=request.user)
    before = windows.page_anchor(conversation, request.GET.get("before"))
    # A reply streaming now will be shown by this page (a reload, another tab): it must carry
    # on when the page that started it goes away.
    stream.note_watched(conversation=conversation)
    return _render_detail(request, conversation, _composer(request, conversation),
                          before=before)


def _composer(request: HttpRequest, conversation: Conversation) -> MessageForm:
    return MessageForm(initial={"model": conversation.model}, user=request.user)


def _render_detail(request: HttpRequest, conversation: Conversation, form: MessageForm,
                   status: int = 200, *, rename_form: ConversationForm | None = None,
                   refusal: str = "", before: Message | None = None,
                   full: bool | None = None, showing: Message | None = None,
                   replies_before: Generation | None = None) -> HttpResponse:
    """The conversation's page: its newest exchanges with the composer, or (``before``) a page
    of earlier ones that links back to the latest."""
    exchanges, has_older = transcript(conversation, before=before, showing=showing,
                                      replies_before=replies_before)
    _keep_rendered(exchanges)
    if full is None:
        full = sending.is_full(conversation)
    return render(request, "chatstream/conversation_detail.html", {
        "conversation": conversation,
        "exchanges": exchanges,
        "older_url": f"?before={exchanges[0]['current']}" if has_older else "",
        "earlier_page": before is not None,
        "newer_url": windows.newer_page_url(conversation, before) if before is not None else "",
        "conversation_full": full,
        "full_message": sending.full_message() if full else "",
        "form": form,
        "rename_form": rename_form or ConversationForm(initial={"title": conversation.title}),
        "refusal": refusal,
        "models": form.models(),
        "quota": quota.remaining(request.user),
    }, status=status)


@login_required
@chat_access_required
@require_POST
def conversation_rename(request: HttpRequest, pk: UUID) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=pk, user=request.user)
    form = ConversationForm(request.POST)
    if not form.is_valid():
        return _render_detail(request, conversation, _composer(request, conversation),
                              status=400, rename_form=form)
    title = form.cleaned_data["title"]
    if not title:
        first = windows.exchanges(conversation).first()
        title = sending.title_from(first.content) if first else ""
    conversation.title = title
    conversation.save(update_fields=["title"])
    return redirect(conversation)


@login_required
@chat_access_required
@require_http_methods(["GET", "POST"])
def conversation_delete(request: HttpRequest, pk: UUID) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=pk, user=request.user)
    if request.method == "POST":
        conversation.delete()
        flash.success(request, _("The conversation was deleted."))
        return redirect("chatstream:conversation-list")
    return render(request, "chatstream/conversation_confirm_delete.html",
                  {"conversation": conversation})


@login_required
@chat_access_required
@require_POST
def message_create(request: HtmxHttpRequest, pk: UUID) -> HttpResponse:
    conversation = get_object_or_404(sending.counting_sent(Conversation.objects.all()), pk=pk,
                                     user=request.user)
    form = MessageForm(request.POST, user=request.user)
    if not form.is_valid():
        if request.htmx:
            return render(request, "chatstream/includes/composer.html",
                          {"conversation": conversation, "form": form,
                           "models": form.models()}, status=400)
        return _render_detail(request, conversation, form, status=400)
    titled = not conversation.title
    try:
        generation = sending.send(request.user, form.cleaned_data["content"],
                                  conversation=conversation, model=form.cleaned_data["model"],
                                  request=request)
    except RequestRefused as refusal:  # kept: the refused reply says why, where it would be
        generation = cast(Generation, refusal.generation)
    except Refusal as refusal:
        return _refused(request, conversation, refusal, form)
    if request.htmx:
        # The new exchange, and the page's heading when this message just gave it its title.
        return render(request, "chatstream/includes/message_created.html", {
            "exchange": exchange(generation.prompt_message, [generation.prompt_message_id],
                                 editable=True, newest=[generation]),
            "conversation": conversation,
            "oob": titled,
        })
    return redirect(conversation)


# The page's status for each refusal sending.py raises.
REFUSAL_STATUS: dict[type[Refusal], int] = {
    InvalidMessage: 400, ReplyStillLive: 409, NotEditable: 409, ConversationFull: 409,
    TooManyReplies: 409, QuotaExceeded: 429,
}


def _refused(request: HtmxHttpRequest, conversation: Conversation, refusal: Refusal,
             form: MessageForm | None = None) -> HttpResponse:
    """A refused message, edit or Retry: for htmx its sentence in the page's notice slot; else
    the conversation's page saying it, with the composer as sent (``form``) and, when the
    conversation is full, the offer of a new one. A quota's ``Retry-After`` as a header."""
    status = next((status for kind, status in REFUSAL_STATUS.items()
                   if isinstance(refusal, kind)), 400)
    if request.htmx:
        response = refusal_response(request, refusal.message, status)
    else:
        response = _render_detail(request, conversation, form or _composer(request, conversation),
                                  status=status, refusal=refusal.message,
                                  full=True if isinstance(refusal, ConversationFull) else None)
    if isinstance(refusal, QuotaExceeded) and refusal.retry_after is not None:
        response["Retry-After"] = str(refusal.retry_after)
    return response


def refusal_response(request: HttpRequest, message: str, status: int) -> HttpResponse:
    """A request refused with one plain sentence (shown by htmx in the page's notice slot)."""
    return render(request, "chatstream/includes/refusal.html", {"message": message},
                  status=status)


@login_required
@chat_access_required
@require_POST
def generation_retry(request: HtmxHttpRequest, pk: UUID) -> HttpResponse:
    original = get_object_or_404(
        Generation.objects.select_related("conversation", "prompt_message", "user"),
        pk=pk, user=request.user,
    )
    model = request.POST.get("model") or None  # Regenerate's: another model, or this one
    if model is not None and access.model_for(request.user, model) is None:
        return refusal_response(request, str(MODEL_NOT_AVAILABLE), 400)
    try:
        generation = sending.retry(original, model=model, request=request)
    except RequestRefused as refusal:  # kept: the refused reply says why, where it would be
        generation = cast(Generation, refusal.generation)
    except Refusal as refusal:
        return _refused(request, original.conversation, refusal)
    if request.htmx:
        return render(request, "chatstream/includes/generation.html",
                      {"generation": generation})
    return redirect(windows.exchange_url(original.conversation, original.prompt_message))


# -- Edits and versions ------------------------------------------------------------------------

def exchange_fragment(request: HttpRequest, message: Message, chain: list[int] | None = None, *,
                      replies_before: Generation | None = None) -> HttpResponse:
    """The exchange of ``message`` (one version of its ``chain``, read when not given) as
    htmx swaps it in: its replies, and whether it may be edited now."""
    conversation = message.conversation
    if chain is None:
        chain = versions.Versions.of(conversation.pk).chain(message.pk)
    editable = versions.last_current(conversation.pk) == message.pk
    shown = exchange(message, chain, editable=editable, replies_before=replies_before)
    _keep_rendered([shown])
    return render(request, "chatstream/includes/exchange.html", {
        "exchange": shown,
        "conversation": conversation,
        "conversation_full": editable and sending.is_full(conversation)})


@login_required
@chat_access_required
@require_POST
def message_edit(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Send the conversation's last message again, edited: the exchange, now showing the new
    version and its reply (htmx swaps it in place of the old one), or a redirect to it."""
    message = get_object_or_404(
        Message.objects.select_related("conversation__user"),
        pk=pk, role=Message.Role.USER, conversation__user=request.user)
    conversation = message.conversation
    titled = conversation.title
    form = EditForm(request.POST)
    if not form.is_valid():
        return _refused(request, conversation, InvalidMessage(str(form.errors["content"][0])))
    try:
        generation = sending.edit(message, form.cleaned_data["content"], request=request)
    except RequestRefused as refusal:  # kept: the refused reply says why, where it would be
        generation = cast(Generation, refusal.generation)
    except Refusal as refusal:
        return _refused(request, conversation, refusal)
    new = generation.prompt_message
    if request.htmx:
        # The exchange, and the page's heading when its title was taken from this message.
        chain = versions.Versions.of(conversation.pk).chain(new.pk)
        return render(request, "chatstream/includes/message_created.html", {
            "exchange": exchange(new, chain, editable=True, newest=[generation]),
            "conversation": conversation, "conversation_full": sending.is_full(conversation),
            "oob": conversation.title != titled})
    return redirect(windows.exchange_url(conversation, new))


@login_required
@chat_access_required
@require_GET
def message_version(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """One version of an exchange (the arrows' target, and its replies' "earlier" and "later"
    links, ``?replies_before=``): for htmx the exchange showing it, else the conversation's
    page with that version in its exchange."""
    message = get_object_or_404(
        Message.objects.select_related("conversation"),
        pk=pk, role=Message.Role.USER, conversation__user=request.user)
    replies_before = windows.reply_anchor(message, request.GET.get("replies_before"))
    conversation = message.conversation
    known = versions.Versions.of(conversation.pk)
    chain = known.chain(message.pk)
    if request.htmx:
        return exchange_fragment(request, message, chain, replies_before=replies_before)
    current = message if message.pk == chain[-1] else get_object_or_404(
        conversation.messages.only("pk", "created_at", "conversation"), pk=chain[-1])
    stream.note_watched(conversation=conversation)
    return _render_detail(request, conversation, _composer(request, conversation),
                          before=windows.page_of(conversation, current), showing=message,
                          replies_before=replies_before)


@require_GET
async def generation_stream(request: HttpRequest, pk: UUID
                            ) -> HttpResponse | StreamingHttpResponse:
    after = resume_point(request)
    if after is None:
        return HttpResponse(BAD_RESUME_POINT, status=400,
                            content_type="text/plain; charset=utf-8")
    wsgi = isinstance(request, WSGIRequest)
    wire = PageWire(partial(rendering.render_final, request))
    stream.maybe_sweep_soon()
    # A page's ticket starts the reply it names, and nothing else, without a session lookup:
    # the claim's one round trip is all that stands before the provider's request (see
    # stream/_tickets.py). Everything else is the session's to authenticate.
    ticket_user = stream.ticket_user_id(pk, request.GET.get(stream.TICKET_PARAMETER),
                                        request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    if ticket_user is not None and not after:  # a resume starts nothing: the session's
        body, _released = await asyncio.gather(
            stream.astart(pk, ticket_user, wire, wsgi=wsgi),
            stream.release_request_connections())
        if body is not None:
            return await stream_response(body, wsgi=wsgi)
    user = await request.auser()
    if not user.is_authenticated:
        return redirect_to_login(_without_ticket(request))
    if wsgi:
        return await buffered_refusal(pk, user.pk, wire) or HttpResponse(NEEDS_ASGI,
                                                                          status=501)
    # The common case first: claim and start at once (one database round trip), while this
    # request's thread gives back the connection the session and the user were read with.
    try:
        body, _released = await asyncio.gather(
            stream.aopen(pk, user.pk, wire, after=after),
            stream.release_request_connections())
    except stream.TooManyFollowers:
        return HttpResponse(TOO_MANY_PAGES, status=429, headers={"Retry-After": "5"})
    if body is None:
        raise Http404
    return await stream_response(body, wsgi=False)


def _without_ticket(request: HttpRequest) -> str:
    """The request's path for a login's ``next``: a ticket has no business in a URL that is
    kept (the login page's address, its logs)."""
    query = request.GET.copy()
    query.pop(stream.TICKET_PARAMETER, None)
    return f"{request.path}?{query.urlencode()}" if query else request.path


@login_required
@require_POST
async def generation_cancel(request: HtmxHttpRequest, pk: UUID) -> HttpResponse:
    user = await request.auser()
    generation = await aget_object_or_404(Generation, pk=pk, user=user)
    # A reply written in steps stops at its step under way (its tools', or its stream).
    generation = await in_executor(sending.last_step)(generation)
    if generation.is_live:
        await stream.arequest_stop(generation.pk)
    if request.htmx:
        return HttpResponse(status=204)
    conversation_id = generation.conversation_id
    return HttpResponseRedirect(
        Conversation(pk=conversation_id).get_absolute_url()
    )


# -- feedback --------------------------------------------------------------------------------------


def _said(rating: int | None, comment: str | None) -> str:
    if rating is None:
        return _("Your rating was taken back.")
    if comment is not None:
        return _("Your comment was saved.") if comment else _("Your comment was removed.")
    return _("Thank you: your rating was saved.")


@login_required
@chat_access_required
@require_POST
def generation_feedback(request: HttpRequest, pk: UUID) -> HttpResponse:
    """Rate a finished reply of the user's own; an htmx request gets the controls back."""
    generation = get_object_or_404(
        with_feedback(Generation.objects.defer("content", "reasoning", "tool_calls",
                                               "upstream_messages")),
        pk=pk, user=request.user)
    htmx = bool(request.htmx)  # type: ignore[attr-defined]  # HtmxMiddleware (required)
    if generation.is_live:
        if htmx:
            return render(request, "chatstream/includes/refusal.html",
                          {"message": STILL_LIVE}, status=409)
        flash.error(request, STILL_LIVE)
        return _back(generation)
    form = FeedbackForm(request.POST)
    commenting = "comment" in request.POST
    if not form.is_valid():
        error = " ".join(str(message) for messages in form.errors.values()
                         for message in messages)
        if not htmx:
            flash.error(request, error)
            return _back(generation)
        state = state_of(generation, error=error, comment_open=True)
        if commenting:  # given back to the user as they wrote it, to shorten
            state = replace(state, comment=request.POST["comment"])
        return render(request, FEEDBACK_TEMPLATE,
                      {"generation": generation, "feedback_state": state}, status=400)
    rating = RATINGS.get(form.cleaned_data["rating"])
    comment = form.cleaned_data["comment"] if commenting else None
    feedback = rate(generation, rating=rating, comment=comment)
    if not htmx:
        flash.success(request, _said(rating, comment))
        return _back(generation)
    state = FeedbackState(
        rating=feedback.rating if feedback else None,
        comment=feedback.comment if feedback else "",
        said=_said(rating, comment), comment_open=commenting and feedback is not None)
    return render(request, FEEDBACK_TEMPLATE, {"generation": generation, "feedback_state": state})


def _back(generation: Generation) -> HttpResponse:
    """The page of the rated reply's exchange (the request came from a page without JS)."""
    return redirect(windows.exchange_url(generation.conversation, generation.prompt_message))
