"""The chat's rules, below the web layer and above the store: the one path that creates a
generation (``sending``), who may chat with which models (``access``), what is sent upstream
within the model's context budget (``history``), token counts (``usage``), the versions of
an edited message (``versions``), the words that tell a user how a reply ended (``notices``),
and what a generation's start and end tell the site (``reporting``). The request hooks, which
a site writes, are ``chatstream.hooks``."""
