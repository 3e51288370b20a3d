"""The signals chatstream sends, for a host site's receivers (see docs/integration.md).

- ``generation_started(sender=Generation, generation=...)``: a stream claimed the generation and
  is about to call the provider.
- ``generation_finished(sender=Generation, generation=...)``: the generation reached a final
  status (``completed``, ``cancelled``, ``interrupted`` or ``failed``), and that save has been
  committed: once per generation, whether a stream, a Stop of a reply nobody had started, a
  request hook's refusal or the sweeper ended it. A process that dies between the commit and
  the send loses the signal.
- ``quota_refused(sender=Generation, user=..., refusal=QuotaExceeded, request=HttpRequest or
  None)``: a limit refused a new message or retry (or a reply's next step); nothing was
  stored.
- ``tool_call_finished(sender=ToolCall, tool_call=...)``: a tool call that started has ended
  (``succeeded``, ``failed``, ``timed_out``, or ``lost`` with its worker), its outcome saved:
  once per call that ran, for auditing side effects (``tool_call.generation.user`` asked for
  it; ``tool_call.decided_by`` approved it, if anyone had to).

Receivers may be sync or async. The streaming ones are sent in the background of the worker
that streams the reply, never before the browser's ``done``: keep a receiver short, or hand its
work to a queue. A receiver that raises is logged (``chatstream.signals``) and changes nothing.
"""

from __future__ import annotations

from django.dispatch import Signal

generation_started = Signal()
generation_finished = Signal()
quota_refused = Signal()
tool_call_finished = Signal()
