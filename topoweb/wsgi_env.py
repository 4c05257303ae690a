"""A request's WSGI environ without the server process's environment variables."""

# What a server puts in a request's environ (PEP 3333), HTTP_* headers and wsgi.* aside.
CGI_NAMES = frozenset(
    {
        "REQUEST_METHOD",
        "SCRIPT_NAME",
        "PATH_INFO",
        "QUERY_STRING",
        "CONTENT_TYPE",
        "CONTENT_LENGTH",
        "SERVER_NAME",
        "SERVER_PORT",
        "SERVER_PROTOCOL",
        "SERVER_SOFTWARE",
        "GATEWAY_INTERFACE",
        "REMOTE_ADDR",
        "REMOTE_HOST",
        "REMOTE_PORT",
    }
)


class WithoutProcessEnvironment:
    """A WSGI application whose requests' environ hold no variable of the server process's
    environment. granian (like wsgiref) starts every environ from `os.environ`, so SECRET_KEY and
    DATABASE_URL's password would be in each request's `META`, and in any error report that
    prints it; they are dropped here (the names of `names` that are neither CGI names nor HTTP
    headers), for a few microseconds a request."""

    def __init__(self, app, names):
        self.app = app
        self.names = frozenset(
            n for n in names if n not in CGI_NAMES and not n.startswith(("HTTP_", "wsgi."))
        )

    def __call__(self, environ, start_response):
        for name in self.names.intersection(environ):
            del environ[name]
        return self.app(environ, start_response)
