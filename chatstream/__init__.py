"""chatstream: live, streaming chat with OpenAI-compatible providers, for any Django site."""

__version__ = "0.1.0.dev0"
