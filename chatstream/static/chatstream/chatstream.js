// chatstream: only what htmx cannot do declaratively. No inline script anywhere (CSP-friendly).
// - Enter sends, Shift+Enter makes a new line; Escape stops the reply being written.
// - While a reply streams the composer (and every Retry) is disabled; the focus comes back after.
// - The page follows a growing reply if the reader is at the bottom, and never yanks them back.
// - Refusals (400 form errors, 409/429/503 sentences, network failures) are shown in place.
// - A reply whose stream breaks picks up where it was (see "Replies that survive the network");
//   one that keeps answering with an HTTP error stops retrying and says so.
(function () {
  "use strict";

  let sending = false; // a message or a retry is on its way to the server
  let wasBusy = null;
  let follow = false;

  const composer = () => document.getElementById("cs-composer");
  const notice = () => document.getElementById("cs-notice");
  const busy = () => sending || document.querySelector(".cs-live") !== null;
  const isComposer = (elt) => elt instanceof HTMLFormElement && elt.id === "cs-composer";
  const isRetry = (elt) => elt instanceof HTMLFormElement && elt.classList.contains("cs-retry");
  // Approve or Deny of a tool call (includes/tool_call.html): refused (409) once decided.
  const isDecision = (elt) => elt instanceof HTMLFormElement &&
    elt.parentElement !== null && elt.parentElement.classList.contains("cs-toolcall-decision");

  function nearBottom() {
    const root = document.documentElement;
    return window.innerHeight + window.scrollY >= root.scrollHeight - 120;
  }

  function scrollToEnd() {
    window.scrollTo(0, document.documentElement.scrollHeight);
  }

  function sync() {
    const isBusy = busy();
    document.querySelectorAll(".cs-retry button").forEach((button) => {
      button.disabled = isBusy;
    });
    const form = composer();
    if (form) {
      form.querySelectorAll("textarea, select, button").forEach((el) => {
        el.disabled = isBusy;
      });
      form.setAttribute("aria-busy", String(isBusy));
      const active = document.activeElement;
      if (!isBusy && wasBusy !== false && (!active || active === document.body)) {
        const box = form.querySelector("textarea");
        if (box) box.focus({ preventScroll: true });
      }
    }
    wasBusy = isBusy;
  }

  function showNotice(html) {
    const slot = notice();
    if (slot) slot.innerHTML = html;
  }

  function showFailure() {
    const slot = notice();
    if (!slot) return;
    const p = document.createElement("p");
    p.className = "cs-notice";
    p.setAttribute("role", "alert");
    p.textContent = slot.dataset.failed || "";
    slot.replaceChildren(p);
  }

  document.addEventListener("keydown", (event) => {
    const target = event.target;
    if (event.key === "Escape") {
      const details = target instanceof Element ? target.closest("details[open]") : null;
      if (details) {
        details.open = false;
        const summary = details.querySelector("summary");
        if (summary) summary.focus();
        return;
      }
      const stops = document.querySelectorAll(".cs-live .cs-stop button:not(:disabled)");
      if (stops.length) {
        event.preventDefault();
        stops[stops.length - 1].click();
      }
      return;
    }
    if (!(target instanceof HTMLTextAreaElement) || !isComposer(target.form)) return;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing || event.keyCode === 229) {
      return;
    }
    event.preventDefault();
    if (!busy() && target.value.trim()) target.form.requestSubmit();
  });

  document.addEventListener("htmx:beforeRequest", (event) => {
    const elt = event.detail.elt;
    if (!isComposer(elt) && !isRetry(elt)) return;
    sending = true;
    showNotice("");
    sync();
  });

  document.addEventListener("htmx:afterRequest", (event) => {
    const elt = event.detail.elt;
    if (!isComposer(elt) && !isRetry(elt)) return;
    sending = false;
    // Not detail.successful: refusals are swapped in, so htmx counts them as successes.
    const status = event.detail.xhr ? event.detail.xhr.status : 0;
    if (status >= 200 && status < 300) {
      const box = isComposer(elt) && composer() ? composer().querySelector("textarea") : null;
      if (box) box.value = "";
      scrollToEnd();
    }
    sync();
  });

  // htmx does not swap error responses by default: put each where the user will see it.
  document.addEventListener("htmx:beforeSwap", (event) => {
    const elt = event.detail.requestConfig && event.detail.requestConfig.elt;
    const status = event.detail.xhr.status;
    if (status < 400 || (!isComposer(elt) && !isRetry(elt) && !isDecision(elt))) return;
    if (isComposer(elt) && status === 400) {
      event.detail.isError = false;
      event.detail.shouldSwap = true; // the form again, with its errors and the user's text
      event.detail.target = elt;
      event.detail.swapOverride = "outerHTML";
    } else {
      showRefusal(event.detail, [409, 429, 503]);
    }
  });

  // A refused request's answer (detail: htmx's beforeSwap): one plain sentence
  // (includes/refusal.html, with one of `statuses`) goes to #cs-notice; any other answer
  // says the request failed.
  function showRefusal(detail, statuses) {
    const type = detail.xhr.getResponseHeader("Content-Type") || "";
    detail.isError = false;
    if (statuses.includes(detail.xhr.status) && type.startsWith("text/html")) {
      detail.shouldSwap = true;
      detail.target = notice();
      detail.swapOverride = "innerHTML";
    } else {
      detail.shouldSwap = false;
      showFailure();
    }
  }

  document.addEventListener("htmx:sendError", (event) => {
    const elt = event.detail.elt;
    if (isComposer(elt) || isRetry(elt) || isDecision(elt)) showFailure();
  });

  // -- Replies that survive the network ------------------------------------------------------
  // Every `delta` carries an id: the characters of the reply the page has. A connection that
  // breaks is reconnected by the browser itself, which sends the id back (Last-Event-ID); a
  // stream that answered with an HTTP error, or a connection gone silent (a dropped network
  // that never said so: the server sends a `ping` event in every silence), is opened again
  // here, asking for the text `?after=` the id. Either way the server sends only the rest, or
  // the reply's end: the page settles on the reply's real state once the site answers again,
  // and says the connection is lost meanwhile. htmx's own retry (which would start over from
  // the first character, and back off to a minute) is not used.
  const GIVE_UP_AFTER = 3; // HTTP errors in a row: the reply cannot be loaded (gone, refused)
  const OPEN_WITHIN = 4000; // ms for a new connection to open before another is tried
  const streams = new WeakMap(); // live element -> what the page knows of its stream
  const pinged = new WeakSet(); // EventSources whose `ping` events are listened to

  // Know each stream's EventSource from its start: one that never opens (a request sent on a
  // connection that died with the network) is tried again too.
  const makeSource =
    htmx.createEventSource || ((url) => new EventSource(url, { withCredentials: true }));
  htmx.createEventSource = (url) => {
    const source = makeSource(url);
    document.querySelectorAll(".cs-live[sse-connect]").forEach((live) => {
      if (live.getAttribute("sse-connect") === url) {
        const known = streamOf(live);
        known.url = url;
        known.source = source;
        known.heard = Date.now();
        known.opened = false;
      }
    });
    return source;
  };

  const liveOf = (event) =>
    event.target instanceof Element ? event.target.closest(".cs-live") : null;

  function streamOf(live) {
    let known = streams.get(live);
    if (!known) {
      known = { url: live.getAttribute("sse-connect") || "", after: "", heard: Date.now(),
                failures: 0, source: null, opened: false, replaces: null };
      streams.set(live, known);
    }
    return known;
  }

  function connectionLost(live, lost) {
    if (live.classList.contains("cs-reconnecting") === lost) return;
    live.classList.toggle("cs-reconnecting", lost);
    const shown = live.querySelector(".cs-reconnect");
    if (!lost) {
      if (shown) shown.remove();
      return;
    }
    const p = document.createElement("p");
    p.className = "cs-status cs-reconnect";
    p.setAttribute("role", "status");
    p.textContent = live.dataset.reconnecting || "";
    live.querySelector(".cs-error-slot").before(p);
  }

  // Open the reply's stream again, from the last character the page has: a fresh copy of the
  // element, which htmx connects and wires as it did the first.
  function reopen(live) {
    if (!live.isConnected || !live.classList.contains("cs-live")) return;
    const known = streamOf(live);
    const base = live.dataset.stream || known.url.split("?")[0];
    const fresh = live.cloneNode(true);
    fresh.setAttribute("sse-connect", known.after ? `${base}?after=${known.after}` : base);
    let replaces = known.source;
    if (replaces && replaces.readyState !== EventSource.OPEN) {
      replaces.close(); // not connected: nothing to hand over
      replaces = null;
    }
    streams.set(fresh, { ...known, heard: Date.now(), source: null, opened: false, replaces });
    live.removeAttribute("sse-connect"); // a retry htmx has pending finds nothing to open
    live.replaceWith(fresh);
    htmx.process(fresh);
  }

  function giveUp(live, source) {
    source.close();
    live.removeAttribute("sse-connect");
    live.removeAttribute("aria-busy");
    live.classList.remove("cs-reconnecting");
    live.classList.replace("cs-live", "cs-unreachable");
    live.querySelectorAll(".cs-typing, .cs-stop, .cs-reconnect").forEach((el) => el.remove());
    const p = document.createElement("p");
    p.className = "cs-status";
    p.setAttribute("role", "status");
    p.textContent = live.dataset.unreachable || "";
    live.append(p);
    sync();
  }

  document.addEventListener("htmx:sseOpen", (event) => {
    const live = liveOf(event);
    const source = event.detail && event.detail.source;
    if (!live || !source) return;
    const known = streamOf(live);
    known.source = source;
    known.heard = Date.now();
    known.opened = true;
    known.failures = 0;
    connectionLost(live, false);
    if (!pinged.has(source)) {
      pinged.add(source);
      source.addEventListener("ping", () => {
        known.heard = Date.now();
      });
    }
    const old = known.replaces;
    if (old) {
      // The connection this one replaces may only have been slow: closed once this one is
      // known to the server, so the reply is never left without a page.
      known.replaces = null;
      window.setTimeout(() => old.close(), 1000);
    }
  });

  document.addEventListener("htmx:sseError", (event) => {
    const live = liveOf(event);
    const source = event.detail && event.detail.source;
    if (!live || !source) return;
    connectionLost(live, true);
    if (source.readyState !== EventSource.CLOSED) return; // the browser reconnects by itself
    const known = streamOf(live);
    known.failures += 1;
    if (known.failures >= GIVE_UP_AFTER) {
      giveUp(live, source);
      return;
    }
    source.close();
    live.removeAttribute("sse-connect"); // instead of htmx's retry: ours, from `after`
    window.setTimeout(() => reopen(live), 500 * 2 ** (known.failures - 1));
  });

  // A connection can die without a word (the network dropped, a phone changed networks): the
  // server sends something at least every ping interval, so a longer silence means the page
  // must connect again.
  function checkSilence(force) {
    const now = Date.now();
    document.querySelectorAll(".cs-live[sse-connect]").forEach((live) => {
      const known = streams.get(live);
      if (!known || !known.source || known.source.readyState === EventSource.CLOSED) return;
      let limit = known.opened ? Number(live.dataset.silence || 20) * 1000 : OPEN_WITHIN;
      if (force) limit = 1000;
      if (now - known.heard > limit) {
        connectionLost(live, true);
        reopen(live);
      }
    });
  }

  window.setInterval(() => checkSilence(false), 1000);
  window.addEventListener("online", () => checkSilence(true));
  window.addEventListener("pageshow", (event) => {
    // Back from the back-forward cache: the browser closed the page's connections.
    if (event.persisted) document.querySelectorAll(".cs-live").forEach(reopen);
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") checkSilence(false);
  });

  document.addEventListener("htmx:sseBeforeMessage", (event) => {
    // EventSource reports a failed connection as an event named "error", the same name as the
    // server's `error` event: only a server event carries data to swap in.
    if (typeof event.detail.data !== "string") {
      event.preventDefault();
      return;
    }
    const live = liveOf(event);
    if (live) {
      const known = streamOf(live);
      known.heard = Date.now();
      if (event.detail.lastEventId) known.after = event.detail.lastEventId;
    }
    follow = nearBottom();
  });

  document.addEventListener("htmx:sseMessage", () => {
    if (follow) scrollToEnd();
  });

  // -- Markdown as it streams ---------------------------------------------------------------
  // The server renders each Markdown block of a reply once it is finished (nothing still to
  // come can change it: see chatstream/web/markdown_blocks.py) and sends it as a `block` event,
  // right after the `delta` that finished it: its first data line names the characters of the reply it covers
  // ("START END", counted as `id:` counts them, in code points), the lines after it are its
  // HTML, sanitised on the server as the final reply is. It goes in, as it is (no wrapper: the
  // same elements as the finished reply, the same styles), before .cs-stream, the text still
  // being written, which loses those characters. data-rendered on .cs-live-text says where
  // .cs-stream's text begins; being an attribute, it survives reopen()'s copy of the element.
  // A stream that starts over from the first character (a reconnection, a `reset`) sends again
  // the blocks the page may have: only the one that starts where the page's rendering ends is
  // taken. The live region is .cs-stream alone, so a rendered block is not read out again.
  function dropCodePoints(tail, count) {
    const walker = document.createTreeWalker(tail, NodeFilter.SHOW_TEXT);
    const emptied = [];
    for (let node = walker.nextNode(); node && count > 0; node = walker.nextNode()) {
      const data = node.data;
      let i = 0;
      for (; i < data.length && count > 0; count -= 1) {
        const unit = data.charCodeAt(i);
        const low = (data.charCodeAt(i + 1) & 0xfc00) === 0xdc00;
        i += unit >= 0xd800 && unit < 0xdc00 && low ? 2 : 1; // a surrogate pair: one character
      }
      if (i >= data.length) emptied.push(node);
      else node.deleteData(0, i);
    }
    emptied.forEach((node) => node.remove());
  }

  document.addEventListener("htmx:sseBeforeMessage", (event) => {
    const type = event.detail.type;
    if ((type !== "block" && type !== "reset") || typeof event.detail.data !== "string") return;
    const live = liveOf(event);
    const shown = live && live.querySelector(".cs-live-text");
    const tail = shown && shown.querySelector(".cs-stream");
    if (!tail) return;
    if (type === "reset") {
      // The whole text again, as text (htmx puts it in .cs-stream); its blocks follow.
      [...shown.childNodes].forEach((node) => {
        if (node !== tail) node.remove();
      });
      shown.dataset.rendered = "0";
      return;
    }
    event.preventDefault(); // not for htmx to swap: put in place here
    const data = event.detail.data;
    const cut = data.indexOf("\n");
    const [start, end] = (cut < 0 ? data : data.slice(0, cut)).split(" ").map(Number);
    if (start !== Number(shown.dataset.rendered || 0) || !(end > start)) return;
    tail.insertAdjacentHTML("beforebegin", cut < 0 ? "" : data.slice(cut + 1));
    dropCodePoints(tail, end - start);
    shown.dataset.rendered = String(end);
    if (follow) scrollToEnd();
  });

  // -- Tool calls ----------------------------------------------------------------------------
  // Each `tool` event is one call's card (includes/tool_call.html) in the state it is in now:
  // it takes the place of the card with its id, or goes last in the reply's .cs-toolcalls. A card
  // the reader unfolded stays unfolded.
  document.addEventListener("htmx:sseBeforeMessage", (event) => {
    if (event.detail.type !== "tool" || typeof event.detail.data !== "string") return;
    event.preventDefault();
    const live = liveOf(event);
    const place = live && live.querySelector(".cs-toolcalls");
    if (!place) return;
    const made = document.createElement("template");
    made.innerHTML = event.detail.data;
    const card = made.content.firstElementChild;
    if (!card || !card.id) return;
    const shown = document.getElementById(card.id);
    if (shown) {
      const open = shown.querySelector("details");
      if (open && open.open) card.querySelector("details").open = true;
      shown.replaceWith(card);
    } else {
      place.append(card);
    }
    if (follow) scrollToEnd();
  });

  // -- Code blocks and copying ---------------------------------------------------------------
  // Every code block of a reply (a <pre>, in the .cs-code that rendering.py wraps it in) gets a
  // Copy button, made here: the model's HTML never holds a button. It copies the code's text
  // exactly, without the language label and without the newline that ends the last line. A
  // finished reply's "Copy reply" (includes/copy_reply.html, hidden without JavaScript) copies
  // the reply's text as the page shows it. Blocks that arrive later (Markdown rendered while a
  // reply streams, htmx swaps) are found by a MutationObserver; clicks are heard once, here.
  // The words come from the translated data-* attributes of the page's [data-copy-code]
  // element (the transcript: conversation_detail.html); a page without one (a host site's own
  // template) has no Copy buttons. Where navigator.clipboard is
  // missing (a page served over plain HTTP) the text is copied from a selected, unseen
  // textarea; if that fails too, the text is selected for the reader to copy.
  const copyWordsOf = () => document.querySelector("[data-copy-code]");
  const copyLabels = new WeakMap(); // button -> its label, while it says "Copied"
  let copySaid = null; // the page's live region saying "Copied"

  function addCopyButtons(root) {
    const words = copyWordsOf();
    if (!words || !(root instanceof Element || root instanceof Document)) return;
    root.querySelectorAll(".cs-copy-reply[hidden]").forEach((button) => {
      button.hidden = false;
    });
    const blocks = [...root.querySelectorAll(".cs-assistant pre")];
    if (root instanceof Element && root.matches(".cs-assistant pre")) blocks.push(root);
    blocks.forEach((pre) => {
      const before = pre.previousElementSibling;
      if (before && before.classList.contains("cs-code-copy")) return;
      const button = document.createElement("button");
      button.type = "button";
      button.className = "cs-code-copy";
      button.textContent = words.dataset.copyCode || "";
      pre.before(button);
    });
    if (!copySaid) {
      copySaid = document.createElement("p");
      copySaid.className = "cs-visually-hidden";
      copySaid.setAttribute("role", "status");
      document.body.append(copySaid);
    }
  }

  function copyThroughSelection(text, button) {
    const box = document.createElement("textarea");
    box.className = "cs-visually-hidden cs-copy-box";
    box.value = text;
    box.readOnly = true;
    box.tabIndex = -1;
    box.setAttribute("aria-hidden", "true");
    button.after(box);
    box.focus({ preventScroll: true });
    box.select();
    let copied = false;
    try {
      copied = document.execCommand("copy");
    } catch (error) {
      copied = false;
    }
    box.remove();
    button.focus({ preventScroll: true });
    return copied;
  }

  function sayCopied(button, copied, source) {
    const words = copyWordsOf();
    const label = button.querySelector(".cs-copy-label") || button;
    const said = (words && (copied ? words.dataset.copied : words.dataset.copyFailed)) || "";
    if (!copyLabels.has(button)) {
      copyLabels.set(button, label.textContent);
      // The button keeps its name while it shows the outcome: the live region says it, once.
      button.setAttribute("aria-label", label.textContent.trim());
    }
    label.textContent = said;
    button.classList.toggle("cs-copied", copied);
    if (copySaid) {
      copySaid.textContent = "";
      window.setTimeout(() => { copySaid.textContent = said; }, 100);
    }
    if (!copied) {
      const range = document.createRange();
      range.selectNodeContents(source);
      window.getSelection().removeAllRanges();
      window.getSelection().addRange(range);
    }
    window.clearTimeout(Number(button.dataset.copyTimer));
    button.dataset.copyTimer = String(window.setTimeout(() => {
      label.textContent = copyLabels.get(button);
      copyLabels.delete(button);
      button.removeAttribute("aria-label");
      button.classList.remove("cs-copied");
    }, 2000));
  }

  async function copyText(button, text, source) {
    let copied = false;
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(text);
        copied = true;
      } catch (error) {
        copied = false; // refused (no permission, page not focused): try the other way
      }
    }
    if (!copied) copied = copyThroughSelection(text, button);
    sayCopied(button, copied, source);
  }

  // The reply as shown: innerText follows the layout (a table's cells, the code's lines), with
  // the code blocks' labels and buttons hidden for the moment of reading.
  function shownText(markdown) {
    markdown.classList.add("cs-copying");
    const text = markdown.innerText;
    markdown.classList.remove("cs-copying");
    return text.trim();
  }

  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target : null;
    const button = target && target.closest(".cs-code-copy, .cs-copy-reply");
    if (!button) return;
    if (button.classList.contains("cs-code-copy")) {
      const pre = button.nextElementSibling;
      if (!pre || pre.tagName !== "PRE") return;
      const code = pre.querySelector("code") || pre;
      copyText(button, code.textContent.replace(/\n$/, ""), code);
      return;
    }
    const reply = button.closest(".cs-assistant");
    const markdown = reply && reply.querySelector(".cs-markdown");
    if (markdown) copyText(button, shownText(markdown), markdown);
  });

  new MutationObserver((records) => {
    for (const record of records) {
      record.addedNodes.forEach((node) => {
        if (node instanceof Element) addCopyButtons(node);
      });
    }
  }).observe(document, { childList: true, subtree: true });
  document.addEventListener("DOMContentLoaded", () => addCopyButtons(document));

  // -- Thinking ------------------------------------------------------------------------------
  // A reasoning model's thinking streams (`thinking` events, escaped text that htmx appends)
  // into the live reply's collapsed <details class="cs-thinking">, shown from its first piece.
  // Its summary says "Thinking…" until the reply's text begins, then how long the thinking
  // took, from the stream's opening (as the server counts it for the finished reply: from the
  // start to the first text). A page that joined mid-reply does not know when it began: its
  // summary then just says "Thinking". A reader who opened the thinking finds it still open in
  // the finished reply that replaces the live one.
  const thinkingOpen = new Set(); // ids of the replies whose thinking the reader opened

  const thinkingOf = (live) => (live ? live.querySelector(".cs-thinking") : null);

  document.addEventListener("htmx:sseOpen", (event) => {
    const details = thinkingOf(liveOf(event));
    const shown = details && details.querySelector(".cs-thinking-text");
    // Nothing shown yet: this page is there from the start (a reconnect keeps its time).
    if (shown && !shown.firstChild && !details.dataset.since) {
      details.dataset.since = String(Date.now());
    }
  });

  document.addEventListener("htmx:sseBeforeMessage", (event) => {
    const details = thinkingOf(liveOf(event));
    if (!details || typeof event.detail.data !== "string") return;
    const type = event.detail.type;
    if (type === "thinking") {
      details.hidden = false;
    } else if ((type === "delta" || type === "reset") && details.dataset.state === "thinking") {
      delete details.dataset.state;
      const summary = details.querySelector(".cs-thinking-summary");
      const since = Number(details.dataset.since);
      if (!summary) return;
      if (since) {
        const seconds = Math.max(1, Math.round((Date.now() - since) / 1000));
        summary.textContent = (details.dataset.thought || "").replace("{seconds}", seconds);
      } else {
        summary.textContent = details.dataset.label || "";
      }
    }
  });

  // `toggle` does not bubble: heard on its way down.
  document.addEventListener("toggle", (event) => {
    const details = event.target;
    if (!(details instanceof HTMLDetailsElement) || !details.classList.contains("cs-thinking")) {
      return;
    }
    const reply = details.closest(".cs-assistant");
    if (!reply || !reply.id) return;
    if (details.open) thinkingOpen.add(reply.id);
    else thinkingOpen.delete(reply.id);
  }, true);

  document.addEventListener("htmx:afterSettle", () => {
    thinkingOpen.forEach((id) => {
      const details = document.getElementById(id);
      const thinking = details ? details.querySelector(".cs-thinking") : null;
      if (thinking && !thinking.open) thinking.open = true;
    });
  });


  // -- Search ------------------------------------------------------------------------------
  // A refused search (400: a query too long) says why in the results region, as the page does.
  document.addEventListener("htmx:beforeSwap", (event) => {
    const target = event.detail.target;
    if (event.detail.xhr.status !== 400 || !target || target.id !== "cs-results") return;
    event.detail.isError = false;
    event.detail.shouldSwap = true;
  });

  // -- Feedback ------------------------------------------------------------------------------
  // A thumb or a comment is answered with the reply's feedback controls, swapped in place by
  // htmx (ids keep the focus where it was); also a 400, which says why a comment was refused.
  // Other refusals go where the composer's do.
  const isFeedback = (elt) => elt instanceof Element && elt.closest(".cs-feedback") !== null;

  document.addEventListener("htmx:beforeSwap", (event) => {
    const elt = event.detail.requestConfig && event.detail.requestConfig.elt;
    const status = event.detail.xhr.status;
    if (status < 400 || !isFeedback(elt)) return;
    const type = event.detail.xhr.getResponseHeader("Content-Type") || "";
    if (status === 400 && type.startsWith("text/html")) {
      event.detail.isError = false;
      event.detail.shouldSwap = true;
    } else {
      showRefusal(event.detail, [409, 429, 503]);
    }
  });

  document.addEventListener("htmx:sendError", (event) => {
    if (isFeedback(event.detail.elt)) showFailure();
  });

  // -- Edits and versions --------------------------------------------------------------------
  // The last message's Edit (a <details> holding its form), the arrows between an exchange's
  // versions, and Regenerate. As for the composer and Retry: refusals land in #cs-notice and
  // nothing is sent while a reply streams; the arrows of an exchange whose reply streams wait
  // too. Only the last exchange keeps its Edit: a message sent since the page was rendered
  // makes the one before it final. An arrow whose request fails is followed as a plain link.
  const isEdit = (elt) => elt instanceof HTMLFormElement && elt.classList.contains("cs-edit-form");
  const isRegenerate = (elt) =>
    elt instanceof HTMLFormElement && elt.classList.contains("cs-regenerate");
  const isStep = (elt) => elt instanceof HTMLAnchorElement && elt.classList.contains("cs-version-step");
  let stepped = null; // the arrow followed: its direction, and the version it shows

  function syncEdits() {
    const isBusy = busy();
    const exchanges = document.querySelectorAll("#cs-transcript > .cs-exchange");
    exchanges.forEach((exchange, i) => {
      if (i < exchanges.length - 1) exchange.querySelectorAll(".cs-edit").forEach((e) => e.remove());
    });
    document.querySelectorAll(".cs-edit").forEach((details) => {
      if (isBusy && !sending) details.open = false;
      details.querySelector("summary").setAttribute("aria-disabled", String(isBusy));
      details.querySelectorAll("textarea, button").forEach((el) => {
        el.disabled = isBusy;
      });
    });
    document.querySelectorAll(".cs-regenerate select, .cs-regenerate button").forEach((el) => {
      el.disabled = isBusy;
    });
    document.querySelectorAll("a.cs-version-step").forEach((step) => {
      const live = step.closest(".cs-exchange").querySelector(".cs-live") !== null;
      step.setAttribute("aria-disabled", String(live));
    });
  }

  document.addEventListener("click", (event) => {
    const summary = event.target instanceof Element ? event.target.closest(".cs-edit > summary") : null;
    if (summary && busy()) event.preventDefault();
  });

  document.addEventListener("toggle", (event) => {
    const details = event.target;
    if (!(details instanceof HTMLDetailsElement) || !details.classList.contains("cs-edit")) return;
    const box = details.querySelector("textarea");
    if (details.open && box) {
      box.focus();
      box.setSelectionRange(box.value.length, box.value.length);
    }
  }, true);

  document.addEventListener("reset", (event) => {
    const details = isEdit(event.target) ? event.target.closest("details") : null;
    if (!details) return;
    details.open = false; // Cancel: the text as it was, the form closed
    details.querySelector("summary").focus();
  });

  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (box instanceof HTMLTextAreaElement && isEdit(box.form) && event.key === "Enter" &&
        (event.ctrlKey || event.metaKey) && !busy()) {
      event.preventDefault();
      box.form.requestSubmit();
    }
  });

  document.addEventListener("htmx:beforeRequest", (event) => {
    const elt = event.detail.elt;
    if (isStep(elt)) {
      if (elt.getAttribute("aria-disabled") === "true") {
        event.preventDefault();
        return;
      }
      stepped = { id: `exchange-${elt.dataset.version}`, step: elt.dataset.step };
    } else if (isEdit(elt) || isRegenerate(elt)) {
      sending = true;
      showNotice("");
      sync();
    }
    syncEdits();
  });

  document.addEventListener("htmx:afterRequest", (event) => {
    const elt = event.detail.elt;
    if (isEdit(elt) || isRegenerate(elt)) {
      sending = false;
      const status = event.detail.xhr ? event.detail.xhr.status : 0;
      if (status >= 200 && status < 300 && isRegenerate(elt)) scrollToEnd();
      sync();
    }
    syncEdits();
  });

  document.addEventListener("htmx:beforeSwap", (event) => {
    const elt = event.detail.requestConfig && event.detail.requestConfig.elt;
    const status = event.detail.xhr.status;
    // An edit's form goes with the exchange it swaps: its afterRequest never reaches here.
    if (isEdit(elt)) sending = false;
    if (status < 400 || !(isEdit(elt) || isRegenerate(elt) || isStep(elt))) return;
    if (isStep(elt)) {
      event.detail.isError = false;
      event.detail.shouldSwap = false;
      window.location.assign(elt.href);
    } else {
      showRefusal(event.detail, [400, 409, 429, 503]);
    }
  });

  document.addEventListener("htmx:sendError", (event) => {
    const elt = event.detail.elt;
    if (isStep(elt)) window.location.assign(elt.href);
    else if (isEdit(elt) || isRegenerate(elt)) showFailure();
  });

  document.addEventListener("htmx:afterSettle", () => {
    syncEdits();
    if (!stepped) return;
    const shown = document.getElementById(stepped.id);
    if (!shown) return; // another swap settled: this one is still on its way
    // The arrow followed is gone with the exchange it was in: the focus goes to its twin.
    const step = shown.querySelector(`a.cs-version-step[data-step="${stepped.step}"]`) ||
      shown.querySelector("a.cs-version-step");
    if (step) step.focus();
    stepped = null;
  });

  document.addEventListener("DOMContentLoaded", syncEdits);


  // -- Reply details -------------------------------------------------------------------------

  document.addEventListener("htmx:afterSettle", sync);
  document.addEventListener("DOMContentLoaded", () => {
    if (document.getElementById("cs-transcript")) scrollToEnd();
    sync();
  });
})();
