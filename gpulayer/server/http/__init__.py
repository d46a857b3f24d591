"""The /v1 application: the Falcon app, its resources and routes, wire parsing, paging, OpenAPI, metrics.

It is a WSGI app and serves nothing itself: server/frontends/ carries it to sockets (granian or cheroot), and
this package imports nothing of that one.
"""
