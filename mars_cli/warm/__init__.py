"""The warm path: a per-user background process that keeps models loaded, so a one-liner's
start-up is a socket connection, not torch's import and a model load.

`address` says where a server for this environment listens (a private Unix socket, never a
network port); `client` asks it to decode (light: no torch); `server` runs it.
"""
