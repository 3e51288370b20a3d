"""The example host site's tools (tests/hostapp/tools.py, quoted by docs/tools.md): a read-only
one the model calls freely, and a refund the user approves on the page, made once."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import pytest

from chatstream import api
from chatstream.models import Generation, ToolCall
from chatstream.tools import ToolContext
from tests.hostapp.models import Order, Refund
from tests.hostapp.tools import refund

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = ["tests.hostapp.tools.order_status", "tests.hostapp.tools.refund"]


def asking_for(settings: Any, *calls: tuple[str, dict[str, Any]]) -> None:
    """The shop's model, played by the simulator: it asks for ``calls``, then answers with
    their results."""
    wanted = json.dumps([[name, json.dumps(arguments)] for name, arguments in calls])
    settings.CHATSTREAM_MODELS = {"shop": {"PROVIDER": "default", "TOOLS": TOOLS,
                                           "MODEL": f"agent?tool_calls={quote(wanted)}"}}


@pytest.fixture
def alice(make_user: Any) -> Any:
    return make_user()


def test_the_model_reads_the_users_own_order_and_no_one_elses(alice, make_user, settings):
    mine = Order.objects.create(customer=alice, status=Order.Status.SHIPPED, total_cents=1999)
    theirs = Order.objects.create(customer=make_user("bob"), total_cents=500)
    asking_for(settings, ("order_status", {"order_id": mine.pk}),
               ("order_status", {"order_id": theirs.pk}))
    last = api.run(api.send(alice, "Where are my orders?"))
    mine_said, theirs_said = last.content.removeprefix("Results: ").split(" | ")
    assert json.loads(mine_said) == {"order": mine.pk, "status": "shipped", "total": 19.99,
                                     "refunded": False}
    assert theirs_said == (f"The user has no order {theirs.pk}; ask for the number on the "
                           "receipt.")


def test_a_refund_waits_for_the_users_approval_on_the_page_and_is_made_once(
        alice, settings, browser_for):
    order = Order.objects.create(customer=alice, status=Order.Status.DELIVERED,
                                 total_cents=2500)
    asking_for(settings, ("refund", {"order_id": order.pk, "reason": "damaged"}))
    browser = browser_for(alice)
    with browser.client.stream("GET", browser.send(browser.new_conversation(),
                                                   "It arrived broken.")) as response:
        page = response.read().decode()
    call = ToolCall.objects.get(name="refund")
    assert call.status == ToolCall.Status.PENDING_APPROVAL and not Refund.objects.exists()
    assert "&quot;reason&quot;: &quot;damaged&quot;" in page  # what the user approves
    answer = browser.post(f"/chat/t/{call.pk}/approve/")
    assert answer.status_code == 200
    made = Refund.objects.get()
    assert (made.order, made.cents, made.tool_call_id) == (order, 2500, call.pk)
    following = Generation.objects.get(follows=call.generation)
    url = re.search(rf'sse-connect="([^"]*{following.pk}[^"]*)"', answer.text).group(1)
    with browser.client.stream("GET", url.replace("&amp;", "&")) as response:
        assert "Refunded 25.00 for order" in response.read().decode()
    assert browser.post(f"/chat/t/{call.pk}/approve/").status_code == 409
    # Run again with the same call (a crash and a retry of the shop's own): refunded once.
    again = refund(order_id=order.pk, reason="damaged",
                   context=ToolContext(alice, call.generation.conversation, call.generation,
                                       call))
    assert again == f"Order {order.pk} was already refunded by this call."
    assert Refund.objects.count() == 1
