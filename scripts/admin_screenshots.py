"""Screenshots of the generation admin for the README: docs/screenshots/admin-*.png.

Builds a demo database (a month of made-up generations) in a temporary SQLite file, serves the
demo project with uvicorn, logs in as a superuser with headless Chromium (Debian's, through
Playwright) and saves the list, the summary page and one generation's page. Not part of the
test suite:

    .venv/bin/python scripts/admin_screenshots.py
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
CHROMIUM = os.environ.get("CHATSTREAM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking"]
PASSWORD = "screenshots-only"

MODELS = {  # model key: (TTFT median ms, spread)
    "gpt-small": (350, 0.35),
    "gpt-large": (900, 0.5),
    "local-llama": (1600, 0.6),
}
USERS = ["amira", "ben", "chloe", "dmitri", "esther", "farid", "grace", "hugo"]
PROMPTS = ["How do I stream a reply with htmx?", "Summarise this meeting for me",
           "Write a haiku about queues", "Why is my migration slow?", "Explain TTFT"]


def build_demo_data() -> None:
    """A month of generations with plausible outcomes, timings and usage."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from chatstream.models import Conversation, Feedback, Generation, Message

    rng = random.Random(7)
    user_model = get_user_model()
    user_model.objects.create_superuser("admin", "admin@example.com", PASSWORD)
    users = [user_model.objects.create_user(name, f"{name}@example.com", PASSWORD)
             for name in USERS]
    weights = [8, 5, 5, 3, 2, 2, 1, 1]
    now = timezone.now()
    for day in range(30):
        for _ in range(rng.randint(25, 60) + (30 - day)):
            user = rng.choices(users, weights)[0]
            created = now - timedelta(days=day, minutes=rng.randint(0, 24 * 60 - 1))
            if created > now:
                continue
            model = rng.choice(list(MODELS))
            median, spread = MODELS[model]
            conversation = Conversation.objects.create(
                user=user, title=rng.choice(PROMPTS), model=model, created_at=created,
                updated_at=created)
            prompt = Message.objects.create(conversation=conversation, role="user",
                                            content=conversation.title, created_at=created)
            roll = rng.random()
            started = created + timedelta(milliseconds=rng.randint(5, 40))
            ttft = timedelta(milliseconds=rng.lognormvariate(0, spread) * median)
            fields: dict[str, object] = {
                "status": "completed", "finish_reason": "stop", "usage_source": "provider",
                "http_status": 200, "prompt_tokens": rng.randint(40, 2400),
                "completion_tokens": rng.randint(20, 900),
                "first_token_at": started + ttft,
                "completed_at": started + ttft + timedelta(seconds=rng.uniform(1, 25)),
            }
            if roll < 0.05:
                fields.update(status="failed", error_type=rng.choice(["http_429", "http_500",
                                                                      "connect"]),
                              http_status=rng.choice([429, 500, None]), first_token_at=None,
                              completion_tokens=None, usage_source="none", finish_reason="")
            elif roll < 0.11:
                fields.update(status="cancelled", error_type="stopped_by_user",
                              finish_reason="", usage_source="estimated")
            elif roll < 0.14:
                fields.update(status="interrupted",
                              error_type=rng.choice(["stall", "worker_lost", "incomplete"]),
                              finish_reason="", usage_source="estimated")
            prompt_tokens = int(fields["prompt_tokens"])  # type: ignore[call-overload]
            if rng.random() < 0.3:
                fields["cached_tokens"] = int(prompt_tokens * 0.6)
            generation = Generation.objects.create(
                conversation=conversation, user=user, prompt_message=prompt, model=model,
                provider_model=f"{model}-2026-01", created_at=created, started_at=started,
                request_id=f"req_{rng.getrandbits(48):012x}", worker="web-1:4121",
                content="A demo reply.", **fields)
            if fields["status"] == "completed" and rng.random() < 0.25:
                good = rng.random() < {"gpt-large": 0.85, "gpt-small": 0.7}.get(model, 0.6)
                Feedback.objects.create(generation=generation, user=user,
                                        rating=1 if good else -1, created_at=created,
                                        updated_at=created)
    build_featured(users[0])


REPLY = """Use the SSE extension and let the server push each token:

```html
<div hx-ext="sse" sse-connect="/chat/g/1/stream/" sse-swap="delta"></div>
```

1. **POST** the message; the server creates the generation.
2. The stream only *tails* it, so a reconnect never starts a second reply.
"""


def build_featured(user: object) -> str:
    """A two-exchange conversation with a tool call: the detail page's screenshot."""
    from django.utils import timezone

    from chatstream.models import Conversation, Generation, Message

    at = timezone.now() - timedelta(minutes=3)
    conversation = Conversation.objects.create(user=user, title="Streaming with htmx",
                                               model="gpt-small", created_at=at, updated_at=at)
    first = Message.objects.create(conversation=conversation, role="user", created_at=at,
                                   content="What does htmx need to show a streamed reply?")
    earlier = Generation.objects.create(
        conversation=conversation, user=user, prompt_message=first, model="gpt-small",
        status="completed", content="Its SSE extension, and a server that sends events.",
        created_at=at, started_at=at, first_token_at=at + timedelta(milliseconds=310),
        completed_at=at + timedelta(seconds=2))
    Message.objects.create(conversation=conversation, role="assistant", generation=earlier,
                           content=earlier.content, created_at=at + timedelta(seconds=2))
    at += timedelta(minutes=1)
    second = Message.objects.create(conversation=conversation, role="user", created_at=at,
                                    content="Show me the markup, and how retries behave.")
    generation = Generation.objects.create(
        conversation=conversation, user=user, prompt_message=second, model="gpt-small",
        provider_model="gpt-small-2026-01", status="completed", finish_reason="stop",
        content=REPLY, created_at=at, started_at=at,
        first_token_at=at + timedelta(milliseconds=287), completed_at=at + timedelta(seconds=6),
        prompt_tokens=412, cached_tokens=256, completion_tokens=164, usage_source="provider",
        http_status=200, request_id="req_7f3a9c1e2b4d", worker="web-1:4121",
        tool_calls=[{"id": "call_1", "type": "function",
                     "function": {"name": "search_docs", "arguments": "{\"q\": \"htmx sse\"}"}}])
    Message.objects.create(conversation=conversation, role="assistant", generation=generation,
                           content=REPLY, created_at=at + timedelta(seconds=6))
    return str(generation.pk)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"uvicorn did not listen on port {port} within {timeout} s")


def shoot(base_url: str) -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 900})
        page.goto(f"{base_url}/admin/login/?next=/admin/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{base_url}/admin/")
        page.goto(f"{base_url}/admin/chatstream/generation/")
        page.click("#toggle-nav-sidebar")  # more room for the columns; remembered
        page.screenshot(path=str(OUT / "admin-list.png"))
        page.goto(f"{base_url}/admin/chatstream/generation/summary/?days=30")
        page.screenshot(path=str(OUT / "admin-summary.png"), full_page=True)
        page.goto(f"{base_url}/admin/chatstream/generation/?q=req_7f3a9c1e2b4d")
        page.click("#result_list tbody tr a")
        page.screenshot(path=str(OUT / "admin-detail.png"), full_page=True)
        browser.close()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="chatstream-shots-") as tmp:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings",
               "SQLITE_PATH": str(Path(tmp) / "demo.sqlite3"), "DJANGO_DEBUG": "1"}  # static files
        os.environ.update(env)
        sys.path.insert(0, str(ROOT))
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        build_demo_data()
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--no-access-log", "--log-level", "warning"],
            cwd=ROOT, env=env,
        )
        try:
            wait_for(port)
            shoot(f"http://127.0.0.1:{port}")
        finally:
            server.terminate()
            server.wait(10)
    print(f"Saved admin-list.png, admin-summary.png and admin-detail.png in {OUT}")


if __name__ == "__main__":
    main()
