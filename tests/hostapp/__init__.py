"""An example host site's app: how a site owner plugs into chatstream (docs/integration.md).

It adds the site's FAQ to every request and refuses messages about passwords (request hooks),
gives interns one model and banned users none (``CHATSTREAM_ACCESS``), bills each finished
reply (a ``generation_finished`` receiver), asks the chat from the command line
(``manage.py hostapp_ask``), and gives its model two tools: an order's status, and a refund the
user approves (tools.py). tests/test_host_app.py drives it end to end.
"""
