"""The user's decisions on tool calls waiting for approval, from the page (each call's card has
Approve and Deny: see includes/tool_call.html).

POST only, behind the session's CSRF check, for the reply's owner alone (anyone else: 404). A
call no longer waiting for a decision answers 409 and changes nothing. The last decision of a
step runs its approved calls in this request, then answers with the exchange as it now is: the
calls' cards as they ended and, when the reply goes on, the next step streaming (as the answer
to a new message carries its reply). Without JavaScript, a redirect to the exchange.
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_POST

from .. import stream
from .._loops import in_executor
from ..domain import access, decisions
from ..exceptions import AlreadyDecided
from ..models import Message, ToolCall
from . import windows
from .views import exchange_fragment, refusal_response


@login_required
@require_POST
async def toolcall_approve(request: HttpRequest, pk: UUID) -> HttpResponse:
    return await _decide(request, pk, approve=True)


@login_required
@require_POST
async def toolcall_deny(request: HttpRequest, pk: UUID) -> HttpResponse:
    return await _decide(request, pk, approve=False)


async def _decide(request: HttpRequest, pk: UUID, *, approve: bool) -> HttpResponse:
    user = await request.auser()
    if not await in_executor(access.may_chat)(user):
        raise await in_executor(access.refused)(user)
    try:
        call, following = await in_executor(decisions.decide)(pk, user, approve=approve)
    except ToolCall.DoesNotExist:
        raise Http404 from None
    except AlreadyDecided as refusal:
        return await sync_to_async(refusal_response)(request, refusal.message, 409)
    if following is not None:
        await stream.aresume(call.generation, following)
    return await sync_to_async(_answer)(request, call.generation.prompt_message_id)


def _answer(request: HttpRequest, message_id: int) -> HttpResponse:
    message = Message.objects.select_related("conversation").get(pk=message_id)
    if request.headers.get("HX-Request") == "true":
        return exchange_fragment(request, message)
    return HttpResponseRedirect(windows.exchange_url(message.conversation, message))
