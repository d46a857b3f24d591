"""The /v1 front end: the Falcon app, resources, wire parsing, OpenAPI, metrics, the HTTP server."""
