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
    if (status < 400 || (!isComposer(elt) && !isRetry(elt))) return;
    const type = event.detail.xhr.getResponseHeader("Content-Type") || "";
    event.detail.isError = false;
    if (isComposer(elt) && status === 400) {
      event.detail.shouldSwap = true; // the form again, with its errors and the user's text
      event.detail.target = elt;
      event.detail.swapOverride = "outerHTML";
    } else if ([409, 429, 503].includes(status) && type.startsWith("text/html")) {
      event.detail.shouldSwap = true; // one plain sentence (includes/refusal.html)
      event.detail.target = notice();
      event.detail.swapOverride = "innerHTML";
    } else {
      event.detail.shouldSwap = false;
      showFailure();
    }
  });

  document.addEventListener("htmx:sendError", (event) => {
    if (isComposer(event.detail.elt) || isRetry(event.detail.elt)) showFailure();
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

  // -- Code blocks and copying ---------------------------------------------------------------

  // -- Thinking ------------------------------------------------------------------------------

  // -- Feedback ------------------------------------------------------------------------------

  // -- Edits and versions --------------------------------------------------------------------

  // -- Reply details -------------------------------------------------------------------------

  document.addEventListener("htmx:afterSettle", sync);
  document.addEventListener("DOMContentLoaded", () => {
    if (document.getElementById("cs-transcript")) scrollToEnd();
    sync();
  });
})();
