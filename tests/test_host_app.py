"""The example host site (tests/hostapp, quoted by docs/integration.md) end to end.

Its request hooks, access rule, billing receiver and management command, through chatstream's
public surface only: pages and streams served by a real ASGI server, replies from the
simulator, and the command in a process of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from html import unescape
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.utils.html import escape

from chatstream.models import Generation, QuotaCharge
from chatstream.quota.admission import estimate_prompt
from chatstream.signals import generation_finished
from chatstream.testing import DEFAULT_TEXT, Simulator
from tests.hostapp import hooks
from tests.hostapp.models import FaqEntry, UsageCharge

from .conftest import Browser, generation_id, read_events
from .workers import ROOT, database_env

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM_PROMPT = "You are the Example Shop's assistant."
HOOKS = ["tests.hostapp.hooks.refuse_passwords", "tests.hostapp.hooks.add_faq"]
REFUSAL = ("Please don't share passwords here. For a password reset, use the Account page.")


@pytest.fixture
def host_site(settings: Any, chatstream_simulator: Simulator) -> Callable[..., Any]:
    """The host app's hooks and access rule on, with two models; returns ``models(spec)``,
    which points both at one simulator scenario."""
    settings.CHATSTREAM_REQUEST_HOOKS = HOOKS
    settings.CHATSTREAM_ACCESS = "tests.hostapp.access.chat_access"
    settings.CHATSTREAM_SYSTEM_PROMPT = SYSTEM_PROMPT

    def models(spec: str = "fast") -> None:
        settings.CHATSTREAM_MODELS = {
            "fast": {"PROVIDER": "default", "MODEL": spec, "LABEL": "Fast"},
            "smart": {"PROVIDER": "default", "MODEL": spec, "LABEL": "Smart"},
        }

    models()
    FaqEntry.objects.create(question="When are you open?", answer="Every day, 9 to 5.",
                            position=1)
    FaqEntry.objects.create(question="Do you ship abroad?", answer="Within the EU only.",
                            position=2)
    return models


@pytest.fixture
def billed() -> Iterator[list[Generation]]:
    """The host app's billing receiver, connected in this process (where the tests' server
    runs); and the generations this process reported finished, in order."""
    from tests.hostapp.receivers import bill

    reported: list[Generation] = []

    def note(sender: Any, generation: Generation, **kwargs: Any) -> None:
        reported.append(generation)

    generation_finished.connect(bill, sender=Generation, dispatch_uid="hostapp.bill")
    generation_finished.connect(note, sender=Generation, dispatch_uid="test_host_app.note")
    yield reported
    generation_finished.disconnect(sender=Generation, dispatch_uid="hostapp.bill")
    generation_finished.disconnect(sender=Generation, dispatch_uid="test_host_app.note")


def charge_of(generation: Generation | str, timeout: float = 10.0) -> UsageCharge:
    """The generation's billing row, once its receiver (in the background) has written it."""
    pk = generation.pk if isinstance(generation, Generation) else generation
    deadline = time.monotonic() + timeout
    while True:
        charges = list(UsageCharge.objects.filter(generation_id=pk))
        if charges:
            assert len(charges) == 1
            return charges[0]
        assert time.monotonic() < deadline, f"generation {pk} was never billed"
        time.sleep(0.05)


def in_group(user: Any, name: str) -> Any:
    user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


def faq_text() -> str:
    return "\n".join(f"Q: {e.question}\nA: {e.answer}" for e in FaqEntry.objects.all())


# --- request hooks ----------------------------------------------------------------------------


def test_the_faq_is_what_the_upstream_received_and_what_the_quota_counted(
        make_user, browser_for, simulator, host_site, billed):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "When can I come by?", "fast")
    assert "event: done" in browser.client.get(url).text
    sent = simulator.last_request.body["messages"]
    assert sent[0]["role"] == "system"
    assert sent[0]["content"].startswith(SYSTEM_PROMPT + "\n\n")
    assert faq_text() in sent[0]["content"]
    assert sent[1:] == [{"role": "user", "content": "When can I come by?"}]
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.upstream_messages == sent
    without_faq = [{"role": "system", "content": SYSTEM_PROMPT}, *sent[1:]]
    charge = QuotaCharge.objects.get(generation_id=generation.pk)
    assert charge.prompt_estimate == estimate_prompt(sent) > estimate_prompt(without_faq)


def test_the_faq_becomes_the_system_prompt_when_the_site_has_none(
        make_user, browser_for, simulator, host_site, settings):
    settings.CHATSTREAM_SYSTEM_PROMPT = ""
    browser = browser_for(make_user())
    browser.client.get(browser.send(browser.new_conversation(), "Hi", "fast"))
    sent = simulator.last_request.body["messages"]
    assert sent == [{"role": "system", "content": "Answer from this FAQ when it applies:\n"
                     + faq_text()}, {"role": "user", "content": "Hi"}]


def test_a_refused_message_shows_the_hooks_sentence_where_the_reply_would_be_and_is_billed_failed(
        make_user, browser_for, simulator, host_site, billed):
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    response = browser.post(conversation + "messages/",
                            {"content": "What is my Password again?", "model": "fast"})
    assert response.status_code == 200
    assert escape(REFUSAL) in response.text and "sse-connect" not in response.text
    page = browser.client.get(conversation).text
    assert "What is my Password again?" in page
    reply = re.search(r'<article class="cs-message cs-assistant cs-failed".*?</article>', page,
                      re.S)
    assert reply is not None and escape(REFUSAL) in reply.group()
    assert simulator.requests == []
    generation = Generation.objects.get()
    assert (generation.status, generation.error_type, generation.reason) == (
        "failed", "refused", REFUSAL)
    charge = charge_of(generation)
    assert (charge.status, charge.user_id, charge.prompt_tokens) == ("failed", browser.user.pk,
                                                                     None)
    assert [g.pk for g in billed] == [generation.pk]


def test_hooks_run_in_order_and_a_refusal_stops_the_rest(
        make_user, browser_for, simulator, host_site, settings):
    """The refusing hook comes first: the FAQ hook (which reads the database) never runs for a
    refused message, so a refusal costs one string test."""
    settings.CHATSTREAM_REQUEST_HOOKS = [*HOOKS, "tests.test_host_app.count_calls"]
    calls.clear()
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    browser.post(conversation + "messages/", {"content": "my password is hunter2"})
    assert calls == []
    browser.client.get(browser.send(conversation, "Hello", "fast"))
    assert [call.messages[0]["content"] for call in calls] == [
        simulator.last_request.body["messages"][0]["content"]]


calls: list[hooks.RequestCall] = []


def count_calls(call: hooks.RequestCall) -> None:
    calls.append(call)


# --- access -------------------------------------------------------------------------------------


def test_an_interns_page_offers_one_model_and_refuses_another(
        make_user, browser_for, simulator, host_site):
    staff, intern = browser_for(make_user("sam")), browser_for(in_group(make_user("ida"),
                                                                         "interns"))
    staff_page = staff.client.get(staff.new_conversation()).text
    assert '<option value="fast"' in staff_page and '<option value="smart"' in staff_page
    conversation = intern.new_conversation()
    for page in (intern.client.get("/chat/").text, intern.client.get(conversation).text):
        assert "Smart" not in page and 'value="smart"' not in page
    response = intern.post(conversation + "messages/", {"content": "Hi", "model": "smart"})
    assert response.status_code == 400 and "This model is not available." in response.text
    assert Generation.objects.count() == 0 and simulator.requests == []
    response = intern.post("/chat/new/", {"model": "smart"}, htmx=False)
    assert response.status_code == 400


def test_a_banned_user_gets_403_on_every_page(make_user, asgi_server, host_site, settings):
    browser = Browser(asgi_server.url, make_user("ben"))  # logged in before the ban
    conversation = browser.new_conversation()
    in_group(browser.user, "banned")
    try:
        assert browser.client.get("/chat/").status_code == 403
        assert browser.client.get(conversation).status_code == 403
        assert browser.post("/chat/new/", htmx=False).status_code == 403
        assert browser.post(conversation + "messages/", {"content": "Hi"}).status_code == 403
    finally:
        browser.close()
    assert Generation.objects.count() == 0


# --- billing --------------------------------------------------------------------------------------


def test_a_reply_read_from_the_page_completes_and_is_billed_once_with_its_tokens(
        make_user, browser_for, simulator, host_site, billed):
    host_site("default?tps=200&first_token_delay=0")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", "smart")
    with browser.client.stream("GET", url) as response:
        events = [(name, data) for _, name, data in read_events(response)]
    assert events[-1][0] == "done"
    assert unescape("".join(data for name, data in events if name == "delta")) == DEFAULT_TEXT
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == "completed" and generation.content == DEFAULT_TEXT
    charge = charge_of(generation)
    assert (charge.status, charge.model, charge.user_id) == ("completed", "smart",
                                                              browser.user.pk)
    assert (charge.prompt_tokens, charge.completion_tokens) == (
        generation.prompt_tokens, generation.completion_tokens)
    assert generation.completion_tokens and generation.prompt_tokens
    # The row is the billing receiver's; the note is the next receiver's, a moment later.
    deadline = time.monotonic() + 10
    while not billed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [g.pk for g in billed] == [generation.pk]


# --- the management command, in a process of its own ---------------------------------------------


class Ask:
    """``manage.py hostapp_ask`` in a subprocess, on the tests' database and settings."""

    def __init__(self, username: str, text: str) -> None:
        overrides = {name: getattr(django_settings, name) for name in dir(django_settings)
                     if name.startswith("CHATSTREAM_")}
        env = {**os.environ, **database_env(), "DJANGO_SETTINGS_MODULE": "tests.settings",
               "DJANGO_DEBUG": "0", "PYTHONUNBUFFERED": "1",
               "CHATSTREAM_TEST_OVERRIDES": json.dumps({**overrides, "HOSTAPP_BILLING": True})}
        env.pop("CHATSTREAM_TEST_POSTGRES", None)
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "hostapp_ask", username, text], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def first_line(self) -> str:
        """What it says once the message is posted (read only once it is known to be there)."""
        assert self.process.stdout is not None
        return self.process.stdout.readline()

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float = 30) -> tuple[int, str, str]:
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, err

    def kill(self) -> None:
        if self.running():
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def ask() -> Iterator[Callable[[str, str], Ask]]:
    started: list[Ask] = []

    def start(username: str, text: str) -> Ask:
        started.append(Ask(username, text))
        return started[-1]

    yield start
    for each in started:
        each.kill()


@pytest.fixture
def across_processes(settings: Any) -> None:
    """No channel layer shared with the command's process: Stop and following go through the
    database (as they would between two hosts without Redis)."""
    settings.CHATSTREAM_CHANNEL_LAYER = None
    settings.CHATSTREAM_STOP_POLL_INTERVAL = 0.2


def started_by(command: Ask, simulator: Simulator) -> Generation:
    """The generation the command posted, once its upstream call is under way."""
    try:
        simulator.wait_for_requests(1, timeout=30)
    except TimeoutError:
        command.kill()
        raise AssertionError(f"the command made no upstream call: {command.wait()}") from None
    first = command.first_line()
    match = re.fullmatch(r"generation ([0-9a-f-]+) (/chat/c/[0-9a-f-]+/)\n", first)
    assert match, first
    generation = Generation.objects.get(pk=match[1])
    assert generation.conversation.get_absolute_url() == match[2]
    return generation


def test_a_reply_the_command_runs_is_shown_live_by_the_page_and_billed_once(
        make_user, browser_for, simulator, host_site, across_processes, billed, ask):
    host_site("default?tps=15&tokens=45&first_token_delay=0.3")  # about 3 s
    browser = browser_for(make_user("carol"))
    command = ask("carol", "When are you open?")
    generation = started_by(command, simulator)
    # The upstream call is the command's: claimed by its process, and the FAQ went with it.
    assert generation.worker.endswith(f":{command.process.pid}")
    assert faq_text() in simulator.requests[0].body["messages"][0]["content"]
    page = browser.client.get(generation.conversation.get_absolute_url()).text
    assert "When are you open?" in page
    stream_url = re.search(r'sse-connect="([^"]+)"', page)
    assert stream_url is not None, "the page shows no live reply"
    names, while_running = [], []
    with browser.client.stream("GET", stream_url[1].replace("&amp;", "&")) as response:
        assert response.status_code == 200
        for _, name, _data in read_events(response):
            names.append(name)
            if name == "delta":
                while_running.append(command.running())
    code, out, err = command.wait()
    assert code == 0, err
    assert names[-1] == "done" and "delta" in names
    assert while_running[0], "the page's first delta came after the command had ended"
    generation.refresh_from_db()
    assert generation.status == "completed"
    assert out.splitlines()[-1] == "status: completed" and generation.content in out
    assert len(simulator.requests) == 1
    charge = charge_of(generation)
    assert (charge.status, charge.completion_tokens) == ("completed",
                                                         generation.completion_tokens)
    assert billed == []  # this process (the page's server) reported nothing: the command did


def test_stop_on_the_page_stops_a_reply_the_command_runs(
        make_user, browser_for, simulator, host_site, across_processes, billed, ask):
    host_site("default?tps=5&tokens=300")  # a minute, unless stopped
    browser = browser_for(make_user("dave"))
    command = ask("dave", "Tell me everything.")
    generation = started_by(command, simulator)
    assert simulator.requests[0].wait_closed(timeout=0.5) is False  # still streaming
    response = browser.post(f"/chat/g/{generation.pk}/cancel/")
    assert response.status_code == 204
    code, out, err = command.wait(timeout=20)
    assert code == 1 and "The reply ended cancelled." in err
    assert out.splitlines()[-1] == "status: cancelled"
    generation.refresh_from_db()
    assert generation.status == "cancelled"
    assert simulator.requests[0].wait_closed(timeout=5) and simulator.requests[0].client_closed
    assert charge_of(generation).status == "cancelled"
    assert billed == []


# --- the guide ----------------------------------------------------------------------------------

GUIDE = ROOT / "docs" / "integration.md"
QUOTE = re.compile(r"```python\n# (tests/hostapp/\S+\.py)\n(.*?)```", re.S)
QUOTES = QUOTE.findall(GUIDE.read_text(encoding="utf-8"))


def test_the_guide_quotes_every_extension_point_of_the_host_app():
    assert {path for path, _ in QUOTES} == {
        "tests/hostapp/hooks.py", "tests/hostapp/access.py", "tests/hostapp/receivers.py",
        "tests/hostapp/management/commands/hostapp_ask.py"}


@pytest.mark.parametrize(("path", "code"), QUOTES, ids=[f"{p}:{c.split()[1]}" for p, c in QUOTES])
def test_the_guide_quotes_the_host_app_as_it_is(path, code):
    assert code in (ROOT / path).read_text(encoding="utf-8")
