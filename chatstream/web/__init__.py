"""The web layer: the pages' views and forms, what answers a stream request, a conversation's
exchanges as the pages and the JSON API show them, the Markdown render (whole, block by block
as a reply streams, and kept on a finished reply's row) and code highlighting."""
