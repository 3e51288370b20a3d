// chatstream: only what htmx cannot do declaratively. No inline script anywhere (CSP-friendly).
(function () {
  "use strict";

  function composer() { return document.getElementById("cs-composer"); }

  function streaming() { return document.querySelector(".cs-live") !== null; }

  // While a reply streams, the composer is disabled; it comes back when the last one ends.
  function syncComposer() {
    var form = composer();
    if (!form) return;
    var busy = streaming();
    form.querySelectorAll("textarea, button, select").forEach(function (el) { el.disabled = busy; });
    form.setAttribute("aria-busy", busy ? "true" : "false");
    if (!busy && document.activeElement === document.body) {
      var box = form.querySelector("textarea");
      if (box) box.focus();
    }
  }

  // Enter sends, Shift+Enter makes a new line.
  document.addEventListener("keydown", function (event) {
    var box = event.target;
    if (!(box instanceof HTMLTextAreaElement) || !box.closest("#cs-composer")) return;
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (box.value.trim()) box.form.requestSubmit();
    }
  });

  // After a message is accepted, clear the box.
  document.addEventListener("htmx:afterRequest", function (event) {
    var form = event.detail.elt;
    if (form && form.id === "cs-composer" && event.detail.successful) {
      form.reset();
    }
  });

  // A refused message (400 with the form's errors, 429 with a quota sentence) is shown in place.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var form = event.detail.requestConfig && event.detail.requestConfig.elt;
    if (!form || form.id !== "cs-composer") return;
    var status = event.detail.xhr.status;
    if (status === 400) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
      event.detail.target = form;
      event.detail.swapOverride = "outerHTML";
    } else if (status === 429) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
      event.detail.swapOverride = "beforeend";
    }
  });

  document.addEventListener("htmx:afterSettle", syncComposer);
  document.addEventListener("htmx:load", syncComposer);
  document.addEventListener("DOMContentLoaded", syncComposer);
})();
