"""The JSON API: chatstream for clients that are not its htmx pages (a React app, a mobile app).

The same paths as the pages (``chatstream.domain.sending`` for a new message or a Retry, the stream
engine with a :class:`~chatstream.stream.JsonWire` for the reply, ``chatstream.domain.access`` for
who may chat), answered in JSON: ``encoding`` (the one JSON form of a conversation, a message
and a generation), ``auth`` (the session with its CSRF check, or
``CHATSTREAM_API_AUTHENTICATE``), ``views`` and ``urls``. docs/json-api.md is its reference.
"""
