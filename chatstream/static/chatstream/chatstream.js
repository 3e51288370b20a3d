// chatstream: only what htmx cannot do declaratively. No inline script anywhere (CSP-friendly).
// - Enter sends, Shift+Enter makes a new line; Escape stops the reply being written.
// - While a reply streams the composer (and every Retry) is disabled; the focus comes back after.
// - The page follows a growing reply if the reader is at the bottom, and never yanks them back.
// - Refusals (400 form errors, 409/429/503 sentences, network failures) are shown in place.
// - A reply whose stream keeps answering with an HTTP error stops retrying and says so.
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

  // htmx's SSE extension retries a stream that answered with an HTTP error forever; after a
  // few tries, give up (removing sse-connect ends its retries) and say what happened.
  const GIVE_UP_AFTER = 3;

  document.addEventListener("htmx:sseError", (event) => {
    const live = event.target instanceof Element ? event.target.closest(".cs-live") : null;
    const source = event.detail && event.detail.source;
    if (!live || !source || source.readyState !== EventSource.CLOSED) return;
    const failures = Number(live.dataset.failures || 0) + 1;
    live.dataset.failures = String(failures);
    if (failures < GIVE_UP_AFTER) return;
    source.close();
    live.removeAttribute("sse-connect");
    live.removeAttribute("aria-busy");
    live.classList.replace("cs-live", "cs-unreachable");
    live.querySelectorAll(".cs-typing, .cs-stop").forEach((el) => el.remove());
    const p = document.createElement("p");
    p.className = "cs-status";
    p.setAttribute("role", "status");
    p.textContent = live.dataset.unreachable || "";
    live.append(p);
    sync();
  });

  document.addEventListener("htmx:sseOpen", (event) => {
    const live = event.target instanceof Element ? event.target.closest(".cs-live") : null;
    if (live) delete live.dataset.failures;
  });

  document.addEventListener("htmx:sseBeforeMessage", (event) => {
    // EventSource reports a failed connection as an event named "error", the same name as the
    // server's `error` event: only a server event carries data to swap in.
    if (typeof event.detail.data !== "string") {
      event.preventDefault();
      return;
    }
    follow = nearBottom();
  });

  document.addEventListener("htmx:sseMessage", () => {
    if (follow) scrollToEnd();
  });

  document.addEventListener("htmx:afterSettle", sync);
  document.addEventListener("DOMContentLoaded", () => {
    if (document.getElementById("cs-transcript")) scrollToEnd();
    sync();
  });
})();
